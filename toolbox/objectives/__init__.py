"""Loss functions. Plain torch: the single source of the math the learners use."""
