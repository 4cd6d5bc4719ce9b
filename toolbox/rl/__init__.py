"""RL data structures and math shared by the algorithms: batches, advantages, weight buckets."""
