"""``weightcast.dcp``: a ``torch.distributed.checkpoint`` (DCP) storage reader over weightcast."""

import datetime
import os
from typing import Any, Callable, Union

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from . import PathLike, Progress

class HuggingFaceStorageReader(StorageReader):
    """A DCP ``StorageReader`` for a safetensors checkpoint: rank 0 alone reads it."""

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
        """DCP's metadata from rank 0's catalogue, broadcast to the other ranks."""
    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None: ...
    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan unchanged."""
    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The plans unchanged."""
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """One weightcast load on every rank, into each rank's plan's boxes."""
