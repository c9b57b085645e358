"""weft for Python trainers: publish policy versions, queue rollout jobs, take trajectory batches.

    import weft

    publisher = weft.Publisher("runs/store", "my-run", serving="bf16")
    publisher.start(model.state_dict())            # version 0
    orchestrator = weft.Orchestrator(url, token)
    orchestrator.announce(0)
    orchestrator.add_jobs(prompts, samples=8)   # or weft.read_dataset(path)'s rows, p.job(8)
    batches = weft.BatchClient(url, token)
    groups = batches.next_batch(32, trainer_version=0, timeout=30)
    ...                                            # a training step on the groups
    result = publisher.publish(model.state_dict())  # the next version, as a delta
    orchestrator.announce(result.version)

Tensors are read in place through DLPack (no copy of the master weights), and every call that
encodes, uploads or waits releases the GIL. See docs/python.md.
"""

from .dataset import DatasetPrompt, read_dataset
from .errors import (Conflict, DataLoss, Error, Internal, InvalidArgument, NotFound, Timeout,
                     Unavailable)
from .orchestrator import BatchClient, BatchTensors, Group, Orchestrator, Sample, batch_tensors
from .publisher import PublishResult, Publisher

__all__ = [
    "BatchClient", "BatchTensors", "Conflict", "DataLoss", "DatasetPrompt", "Error", "Group",
    "Internal", "InvalidArgument", "NotFound", "Orchestrator", "PublishResult", "Publisher",
    "Sample", "Timeout", "Unavailable", "batch_tensors", "read_dataset",
]
