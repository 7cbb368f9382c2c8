"""weightcast: load safetensors checkpoints into PyTorch, zero-copy and in place.

The reference is docs/python.md. ``import weightcast`` does not import torch.
"""

import datetime
import os
from typing import Callable, Mapping, NamedTuple, Union

import torch

__version__: str

PathLike = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]
KeyMap = Union[str, Mapping[str, str], Callable[[str], Union[str, None]], None]

class Error(RuntimeError):
    """A failed weightcast call.

    ``str(error)`` is the library's one-line message naming the file, offset, tensor, key or
    config key. ``status`` is the ``<sysexits.h>`` code the CLI exits with for the same
    failure: 64 usage, 65 invalid checkpoint (or: it does not fit the model), 66 missing input,
    69 unavailable, 70 internal, 74 I/O, 75 timeout, 78 config. A subclass of RuntimeError,
    which torch's ``load_state_dict`` raises for the same faults. Status 66 is raised as
    ``MissingInputError`` (also a ``FileNotFoundError``) and 74 as ``InputOutputError`` (also
    an ``OSError``), as ``open()`` and ``safetensors.torch.load_file`` raise for those faults;
    ``Error(message, 66)`` or ``Error(message, 74)`` makes one of them. Picklable: an
    unpickled error has the same class, message and status.
    """

    status: int
    def __init__(self, message: str = "", status: int | None = None) -> None:
        """``status`` None: the class's own (70 for ``Error``, 66, 74 for the kinds below)."""
    @property
    def kind(self) -> str:
        """The status's short name, e.g. ``"missing input"``."""

class MissingInputError(Error, FileNotFoundError):
    """Status 66 (missing input): the checkpoint, a shard or the config file is not there (or
    is a directory or another non-file where a file was expected). ``errno`` is ENOENT;
    ``filename`` is None (the message names the path)."""

class InputOutputError(Error, OSError):
    """Status 74 (I/O): a read failed, a file changed under the reader, or O_DIRECT was
    refused with ``direct_io="on"``. ``errno`` is None (the message carries the system's
    reason)."""

class Progress(NamedTuple):
    """How far a load has come on this rank (passed to a ``progress=`` callable)."""

    bytes_done: int
    bytes_total: int
    chunks_done: int
    chunks_total: int
    seconds: float
    shard: str

class LoadReport:
    """What ``load_into`` did, in ``load_state_dict``'s words plus what it measured."""

    missing_keys: list[str]
    """Destination keys no checkpoint tensor landed in (a tied key is loaded when any key of
    its tie group was)."""
    unexpected_keys: list[str]
    """Checkpoint keys (after ``key_map``) with no destination."""
    loaded_keys: list[str]
    """Destination keys written, in checkpoint file order."""
    cast_keys: list[str]
    """Loaded keys whose destination dtype differs from the checkpoint's (cast on landing)."""
    staged_keys: list[str]
    """Loaded keys that could not land in place (a cast the receiver does not make: F8 into
    FP32, F16 into BF16, any cast into CUDA memory; a strided destination; one on another
    device than the load's): they landed in a tensor of the checkpoint's dtype, which
    ``copy_`` then wrote into the destination (so memory beyond the model for those only)."""
    bytes: int
    """Bytes this rank received: its local shards, in the checkpoint's dtype."""
    seconds: float
    """Wall time of the load pipeline on this rank, seconds."""
    verdict: str
    """Rank 0's verdict, the same on every rank: ``"3 ranks, 31 local shards bit-exact
    (...)"`` (the local shards of every rank counted together) when every rank's digests
    matched rank 0's (``verify``, the default); ``"..., not compared (verify: none)"`` with
    ``verify=False``; ``"1 rank: 2 tensors loaded (nothing to compare)"`` at world size 1,
    whatever ``verify`` is (the tensors this call loaded). A mismatch raises instead (70)."""
    def __init__(self, missing_keys: list[str] = ..., unexpected_keys: list[str] = ...,
                 loaded_keys: list[str] = ..., cast_keys: list[str] = ...,
                 staged_keys: list[str] = ..., bytes: int = ...,
                 seconds: float = ..., verdict: str = ...) -> None: ...

def load(
    checkpoint: PathLike,
    *,
    device: str | int | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    placement: str | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    unsupported_dtypes: str = "error",
    rendezvous_port: int | None = None,
    alone: bool = False,
) -> dict[str, torch.Tensor]:
    """Loads every tensor of a safetensors checkpoint, on this rank or on every rank.

    Under a launcher (mpirun, srun, torchrun: the world as ``weightcast run`` detects it,
    from the config's ``world.*``, else ``RANK``/``WORLD_SIZE``, Slurm's or Open MPI's
    variables) every rank calls it: rank 0 alone reads the checkpoint (the others never open
    ``checkpoint``), and the tensors reach the other ranks over MPI (host memory; the ranks
    must be started by mpirun) or NCCL (CUDA). A failure on any rank raises ``Error`` on
    every rank, its message naming the rank ("rank 2: ..."). Every rank must make the same
    call, naming the same checkpoint; loads on several ranks run one at a time per process.

    Args:
        checkpoint: a ``.safetensors`` file, a ``*.safetensors.index.json``, or a directory
            holding one index or exactly one ``.safetensors`` file (transformers'
            ``save_pretrained`` layout). A str, bytes or ``os.PathLike``; a file name that is
            not UTF-8 (bytes, or a str with surrogate escapes as ``os.listdir`` gives it)
            opens too. Another type raises TypeError. On several ranks every rank names the
            checkpoint as rank 0 does (the path as given, lexically normalised: ``"./a/"`` is
            ``"a"``; never opened but on rank 0): a rank naming another raises 78 on every
            rank, naming that rank's path and rank 0's, before rank 0 opens anything.
        device: where the tensors live: ``"cpu"`` (the default without ``config``),
            ``"cuda"`` (one rank: torch's current device; several ranks: the local rank's
            GPU, ``cuda:0`` when the process sees one device, as docs/gpu.md's rule; where
            torch's current device is another GPU it raises ``Error`` 78 naming the rank,
            both devices and the ``torch.cuda.set_device`` call to make), ``"cuda:N"``, an
            int ``N`` (the same as ``"cuda:N"``, as torch and safetensors read an int), a
            ``torch.device``, or ``"auto"`` (a GPU when this build has CUDA and one is
            visible, else cpu).
            With ``config`` and no ``device``, the config's ``device`` key decides.
        chunk_size: bytes per chunk, an int (anything ``operator.index`` takes, e.g. a
            numpy integer) or a size string (``"16MiB"``); 1 B to 4 GiB.
        buffer_depth: staging slots (1 to 1024, an int as for chunk_size); host memory is
            chunk_size × buffer_depth.
        io_depth: reads in flight (1 to 4096, an int as for chunk_size).
        direct_io: O_DIRECT reads: ``"auto"`` (buffered for a shard in the page cache or on a
            filesystem that refuses O_DIRECT), ``"on"``/True, ``"off"``/False.
        timeout: the longest any stage may make no progress: seconds, a ``timedelta`` or a
            duration string (``"300s"``); default 300 s; counted in whole milliseconds.
            NaN, infinite, zero, negative or under 0.001 seconds raise (78). On several ranks
            it also bounds the rendezvous: a rank that never calls is named ("rank(s) 1-2
            did not join", 75) within it.
        placement: ``"replicate"`` (every rank gets every tensor whole) or ``"fsdp"`` (each
            rank gets its ``Shard(0)`` local shard, ``torch.chunk``'s split, of every tensor
            of at least one dimension); at world size 1 both give whole tensors.
        config: a weightcast YAML config (configs/default.yaml); keywords given here override
            its keys.
        progress: None (default): a one-line bar on stderr on rank 0 when stderr is a
            terminal, silent otherwise; True/False forces it on/off; a callable receives a
            ``Progress`` at most every 0.1 s and after the last chunk, on a thread of its
            own: the load never waits for it, and updates that come while it runs are
            dropped but the latest (the last chunk's arrives before the call returns). One
            that raises is reported as unraisable and dropped. Anything else raises (78).
        reader: ``"auto"`` (io_uring, else a pread pool with a notice), ``"uring"``,
            ``"pread"``.
        verify: on several ranks, whether each rank hashes what it received (XXH3-64, as the
            bytes land) and rank 0 checks every digest against its own of the bytes it read,
            raising (70) on every rank, naming rank and tensor, where one differs. Default: the
            config's ``verify`` (``digest``, i.e. True). False skips the hashing
            (bench/RESULTS.md measures what it costs). ``LoadReport.verdict`` says which ran.
            Unused at world size 1. Exactly a Python bool: anything else (``"none"``, 1,
            ``numpy.True_``) raises (78).
        rendezvous_port: rank 0's TCP port where the ranks meet (1 to 65535); default the
            config's ``rendezvous.port``, 29555. Unused at world size 1. Rank 0's address is
            ``$MASTER_ADDR``, else 127.0.0.1 (or the config's ``rendezvous.address``). An int
            as for chunk_size.
        alone: True loads on this process only, as a world of one rank, whatever the
            launcher's environment says (e.g. rank 0 alone under mpirun, for an evaluation):
            no rendezvous, no MPI. Default False. Anything but a bool raises (64).
        unsupported_dtypes: ``"error"`` (default): a dtype torch has no dtype for (F6_E2M3,
            F6_E3M2; F8_E8M0 or F4 on a torch without float8_e8m0fnu/float4_e2m1fn_x2; F4 with
            an odd last dimension) raises before any byte is read, as
            ``safetensors.torch.load_file`` refuses it; ``"bytes"``: such a tensor comes as a
            1-D uint8 tensor of its raw bytes.

    Returns:
        Every tensor by name, in file order: zero-copy views of one arena, with the
        checkpoint's dtype and shape (F4 as ``float4_e2m1fn_x2`` with the last dimension
        halved, as safetensors does), contiguous. The arena is freed when the last tensor
        viewing it is. On CUDA the data is complete, on every stream, when the call returns.
        On several ranks with ``placement="fsdp"``: this rank's local shard of each tensor
        (its ``Shard(0)`` rows; shape ``[0, ...]`` where it has none), by name.

    Raises:
        Error: 66 when the checkpoint or a shard does not exist; 65 when it breaks the
            safetensors format (naming file, tensor and numbers) or holds a dtype torch cannot
            represent; 74 on a failed read; 75 when a stage stalls past ``timeout``; 78 for a
            bad keyword or config value (naming it); 69 when CUDA is asked for where the build
            or machine has none, a peer rank is lost, or host tensors on several ranks were
            not started by mpirun; 75 when a rank stalls (naming it) or did not join within
            ``timeout``; 78 on every rank when a rank names another checkpoint than rank 0;
            64 when this process is already running a load on several ranks (from another
            thread). On several ranks every message starts with the rank it concerns.
        KeyboardInterrupt: Ctrl-C stops the load within moments (the GIL is released while it
            runs; signal handlers run every 50 ms), also while rank 0 waits at the
            rendezvous for ranks that never come.
    """

def load_into(
    model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    checkpoint: PathLike,
    *,
    strict: bool = True,
    key_map: KeyMap = None,
    device: str | int | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    rendezvous_port: int | None = None,
    alone: bool = False,
) -> LoadReport:
    """Loads a checkpoint into the caller's own tensors, in place.

    The destinations are ``model.state_dict()`` (parameters and persistent buffers, written
    through the tensors it returns) or the mapping given. A plain tensor gets its whole
    checkpoint tensor; a DTensor (FSDP2 ``fully_shard``, tensor parallel) gets its local shard,
    from its device mesh and placements (``Shard(d)``, ``Replicate()``), written into
    ``to_local()``. Bytes land in the destinations themselves (no copy of the checkpoint
    beside the model); on several ranks every rank calls it, rank 0 alone reads, and each
    rank receives only its local shards. A dtype that differs is cast on landing between
    floating dtypes: BF16/F16 into FP32 and FP32 into BF16/F16 (round-to-nearest-even) by the
    receiver, the bytes travelling in the checkpoint's dtype, bit-exact with ``Tensor.to``
    but for NaN payloads (NaN stays NaN of its sign); other pairs (F8 into FP32, F16 into
    BF16) land in the checkpoint's dtype and ``copy_`` casts them. Tensors sharing memory
    (tied weights, ``lm_head.weight`` and ``embed_tokens.weight``) are one destination: the
    group is loaded when any of its keys is in the checkpoint. Every check runs before any byte is read.

    Args:
        model_or_state_dict: a ``torch.nn.Module`` or a mapping of key to ``torch.Tensor``;
            no tensor on the meta device (call ``model.to_empty(device=...)`` first).
        checkpoint: as for ``load``.
        strict: missing or unexpected keys raise (naming them), as ``load_state_dict(strict=
            True)``; with False they are only reported. A shape mismatch raises either way, as
            in torch. A bool: anything else raises (64) rather than being read as truthy.
        key_map: renames checkpoint keys to destination keys: a str is a prefix removed from
            the checkpoint keys that start with it (``"model."`` loads a ``LlamaForCausalLM``
            checkpoint into a bare ``LlamaModel``); a dict maps checkpoint key to destination
            key (others unchanged); a callable returns the destination key, or None to skip
            the tensor (not counted as unexpected). A destination key that is not a str
            raises (64), naming the checkpoint key.
        device: the arena's device (as for ``load``); default: the destinations' GPU when they
            all live on one, else cpu.
        chunk_size, buffer_depth, io_depth, direct_io, timeout, config, progress, reader,
            verify, rendezvous_port, alone: as for ``load``.

    Returns:
        A ``LoadReport``: missing_keys, unexpected_keys, loaded_keys, cast_keys, staged_keys,
        bytes, seconds, verdict.

    Raises:
        Error: 65 for a shape mismatch, a dtype that does not cast (integer or bool against
            floating), or (strict) missing/unexpected keys, naming the keys; 64 for a key
            that is not a str, a meta tensor, a key_map mapping two checkpoint keys to one
            destination, or a destination that is not a tensor, a DTensor placed other than
            Shard(d)/Replicate(), a destination ``copy_`` cannot write (elements sharing
            memory, as ``expand`` makes; an inference tensor outside inference mode),
            ``strict`` not a bool; and whatever ``load`` raises. On several ranks every check
            runs on every rank once rank 0 has sent the catalogue, so a refused load raises on
            every rank.
    """

def build_info() -> dict[str, object]:
    """What this build has: ``version`` (str), ``cuda`` and ``mpi`` (bool)."""

__all__ = ["Error", "LoadReport", "Progress", "build_info", "load", "load_into"]
