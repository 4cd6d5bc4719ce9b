"""Typed traces of a run: what each role saw and produced at a step (`entries`), how learner rank 0 records
a few sampled prompts per step (`record`), and how a run's samples become SFT or DPO datasets (`datasets`).

Plain Python and torch, no Ray: the learner actor calls `record.sample_traces`, callbacks write the entries.
"""

from toolbox.tracing.entries import (
    SampleInputs,
    SampleOutputs,
    SampleTrace,
    StepSamples,
    TraceEntry,
    TraceRequest,
)

__all__ = ["SampleInputs", "SampleOutputs", "SampleTrace", "StepSamples", "TraceEntry", "TraceRequest"]
