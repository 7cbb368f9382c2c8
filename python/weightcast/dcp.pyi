"""``weightcast.dcp``: a ``torch.distributed.checkpoint`` (DCP) storage reader over weightcast.

Importing it imports torch. The reference is docs/python.md, "DCP reader".
"""

import datetime
import os
from typing import Any, Callable, Union

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from . import PathLike, Progress

class HuggingFaceStorageReader(StorageReader):
    """Reads a safetensors checkpoint for ``dcp.load``, in place of torch's class of the same
    name: ``dcp.load(state_dict, storage_reader=HuggingFaceStorageReader(path))``.

    ``path`` is what ``weightcast.load`` takes (a ``.safetensors`` file, an index, or a
    directory with one index or exactly one ``.safetensors`` file), the same on every rank;
    rank 0 alone opens it. ``thread_count`` is torch's keyword, accepted (at least 1) and
    unused: rank 0 reads with weightcast's reader (``io_depth``). The other keywords are
    ``weightcast.load_into``'s, with its meaning and checks: ``device``, ``chunk_size``,
    ``buffer_depth``, ``io_depth``, ``direct_io``, ``timeout``, ``config``, ``progress``,
    ``reader``, ``verify``, ``rendezvous_port``, ``alone``; a bad value raises ``Error``
    (78; 64 for ``thread_count`` and ``alone``) here, before any load.

    On several ranks torch's default process group must be initialised, numbering the ranks
    as weightcast's world does (the launcher's environment): ``read_metadata`` sends rank 0's
    metadata over it (``Error`` 78 when the two worlds differ, 64 without a process group).

    Each rank's DCP plan must ask one box per tensor (the global offsets and lengths of its
    ``ReadItem``): whole tensors, ``Shard(d)``, ``Replicate`` and their products on a mesh
    of several dims (FSDP2 over tensor parallel too). Two boxes of one tensor on one rank
    raise ``Error`` (64) naming the tensor and both boxes. A destination
    that is contiguous, on the load's device, in the checkpoint's dtype or one the receiver
    casts to (BF16/F16 -> FP32, FP32 -> BF16/F16, host) is written in place; any other
    lands in the checkpoint's dtype first and ``copy_`` writes it, as torch's reader does.

    Errors are ``weightcast.Error`` on every rank; DCP wraps them: ``dcp.load`` raises its
    ``CheckpointException``, whose ``failures`` hold each rank's exception (for a failure in
    ``read_metadata``, DCP's own ``AssertionError`` quoting weightcast's message).
    """

    path: PathLike
    thread_count: int
    load_id: str
    def __init__(
        self,
        path: PathLike,
        thread_count: int = 1,
        *,
        device: Union[str, Any, None] = None,
        chunk_size: Union[int, str, None] = None,
        buffer_depth: Union[int, None] = None,
        io_depth: Union[int, None] = None,
        direct_io: Union[bool, str, None] = None,
        timeout: Union[float, str, datetime.timedelta, None] = None,
        config: Union[PathLike, None] = None,
        progress: Union[bool, Callable[[Progress], None], None] = None,
        reader: Union[str, None] = None,
        verify: Union[bool, None] = None,
        rendezvous_port: Union[int, None] = None,
        alone: bool = False,
    ) -> None: ...
    def reset(self, checkpoint_id: Union[str, os.PathLike[str], None] = None) -> None:
        """Points the reader at ``checkpoint_id`` when given; a new ``load_id``."""
    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike[str]]) -> bool:
        """True for any path: ranks other than 0 need not see the files."""
    def read_metadata(self) -> Metadata:
        """DCP's metadata from rank 0's catalogue (per tensor its dtype, global shape and one
        chunk covering it), broadcast to the other ranks; every rank calls it. Raises
        ``Error`` on every rank when rank 0 cannot open the checkpoint (66, 65, ...)."""
    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None: ...
    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan unchanged."""
    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The plans unchanged."""
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """One weightcast load on every rank (rank 0 reads, each rank receives its plan's
        boxes into ``planner.resolve_tensor(item)``, then ``planner.commit_tensor``); the
        future is done when it returns. Raises ``Error`` on every rank when any rank fails,
        within ``timeout``."""
