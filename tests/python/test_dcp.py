"""weightcast.dcp.HuggingFaceStorageReader under torch.distributed.checkpoint (DCP): the same
bytes as torch's own HuggingFaceStorageReader, in one process, on 2 ranks under mpirun with
FSDP2 (fully_shard on a gloo CPU mesh) and on 4 ranks on a 2 × 2 mesh (plain tensors, and a
transformers Llama with torch's tensor-parallel plan under fully_shard), where only rank 0 can
open the files; a missing key, an unopenable checkpoint and a failure inside read_data raise
on every rank."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import weightcast
from test_multirank import free_ports, run_ranks, save_tiny_llama

dcp = pytest.importorskip("torch.distributed.checkpoint")
CheckpointException = pytest.importorskip("torch.distributed.checkpoint.api").CheckpointException
safetensors_torch = pytest.importorskip("safetensors.torch")

import weightcast.dcp  # noqa: E402  (imports torch.distributed.checkpoint)

HERE = Path(__file__).resolve().parent
RANKS = 2


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.fixture()
def bf16_checkpoint(tmp_path):
    torch.manual_seed(5)
    tensors = {
        "embed.weight": torch.randn(11, 6).to(torch.bfloat16),
        "layers.0.weight": torch.randn(4, 3, 5).to(torch.bfloat16),
        "layers.0.bias": torch.randn(7).to(torch.bfloat16),
        "scale": torch.randn(()).to(torch.bfloat16),
        "empty": torch.zeros(0, 3).to(torch.bfloat16),
    }
    # Values FP32 cannot hold exactly in BF16 are not needed: BF16 -> FP32 is exact; the
    # point is that both readers cast alike.
    tensors["layers.0.bias"][0] = float("inf")
    safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path, tensors


def _load(state_dict, reader):
    with warnings.catch_warnings():  # DCP warns that no process group means one process
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state_dict, storage_reader=reader)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_process_matches_torchs_reader_bit_exact(bf16_checkpoint, dtype):
    path, tensors = bf16_checkpoint
    ours = {k: torch.full(v.shape, 7.0, dtype=dtype) for k, v in tensors.items()}
    theirs = {k: torch.full(v.shape, 7.0, dtype=dtype) for k, v in tensors.items()}
    _load(ours, weightcast.dcp.HuggingFaceStorageReader(path, timeout=20, progress=False))
    _load(theirs, dcp.HuggingFaceStorageReader(str(path)))
    for k in tensors:
        assert ours[k].dtype == dtype and ours[k].shape == tensors[k].shape, k
        assert raw(ours[k]) == raw(theirs[k]), k
    assert raw(ours["layers.0.weight"].to(torch.bfloat16)) == raw(tensors["layers.0.weight"])


def test_a_narrowed_or_strided_destination_lands_through_copy(bf16_checkpoint):
    # A transposed (non-contiguous) FP32 destination: landed in the checkpoint's dtype, then
    # copied by torch, as torch's reader writes it.
    path, tensors = bf16_checkpoint
    ours = {"embed.weight": torch.zeros(6, 11).t()}
    theirs = {"embed.weight": torch.zeros(6, 11).t()}
    _load(ours, weightcast.dcp.HuggingFaceStorageReader(path, timeout=20, progress=False))
    _load(theirs, dcp.HuggingFaceStorageReader(str(path)))
    assert torch.equal(ours["embed.weight"], theirs["embed.weight"])
    assert torch.equal(ours["embed.weight"], tensors["embed.weight"].float())


def test_a_key_the_checkpoint_lacks_raises_naming_it(bf16_checkpoint):
    path, tensors = bf16_checkpoint
    target = {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in tensors.items()}
    target["not.in.checkpoint"] = torch.zeros(2)
    with pytest.raises(CheckpointException, match="not.in.checkpoint"):
        _load(target, weightcast.dcp.HuggingFaceStorageReader(path, timeout=20, progress=False))


def test_a_checkpoint_that_cannot_be_opened_raises_with_weightcasts_message(tmp_path):
    with pytest.raises(CheckpointException, match="no_such_dir: no such file"):
        _load({"x": torch.zeros(1)}, weightcast.dcp.HuggingFaceStorageReader(
            tmp_path / "no_such_dir", timeout=20, progress=False))


def _save_pieces(path: Path, whole: torch.Tensor, rows: list[tuple[int, int]]) -> None:
    """Pieces of ``whole`` by rows, a file per piece, as torch's HuggingFaceStorageWriter(
    save_distributed=True) writes them (safetensors' own writer, DCP_SHARDING_INFO)."""
    path.mkdir()
    for i, (begin, end) in enumerate(rows, start=1):
        offsets = [begin] + [0] * (whole.dim() - 1)
        safetensors_torch.save_file(
            {"w": whole[begin:end].contiguous()},
            str(path / f"shard-{i:05d}-model-00001-of-00001.safetensors"),
            metadata={"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": offsets}}),
                      "format": "pt"})


def test_one_process_loads_pieces_as_torchs_reader_does(tmp_path):
    torch.manual_seed(3)
    whole = torch.randn(5, 4).to(torch.bfloat16)
    _save_pieces(tmp_path / "pieces", whole, [(0, 3), (3, 5)])
    # A contiguous destination (a box per piece lands in place) and a transposed FP32 one
    # (each box staged, then copied, and cast).
    for make in (lambda: torch.zeros(5, 4, dtype=torch.bfloat16), lambda: torch.zeros(4, 5).t()):
        ours, theirs = {"w": make()}, {"w": make()}
        _load(ours, weightcast.dcp.HuggingFaceStorageReader(tmp_path / "pieces", timeout=20,
                                                            progress=False))
        _load(theirs, dcp.HuggingFaceStorageReader(str(tmp_path / "pieces")))
        assert raw(ours["w"]) == raw(theirs["w"])
        assert raw(ours["w"].to(torch.bfloat16)) == raw(whole)


def test_pieces_that_leave_a_hole_are_refused_where_torchs_reader_loads_them(tmp_path):
    whole = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    _save_pieces(tmp_path / "pieces", whole, [(0, 2), (4, 6)])  # rows 2-3 in no file
    theirs = {"w": torch.full((6, 2), -1.0)}
    _load(theirs, dcp.HuggingFaceStorageReader(str(tmp_path / "pieces")))
    assert (theirs["w"][2:4] == -1).all()  # torch's reader leaves them as they were
    with pytest.raises(CheckpointException, match=r"'w'.* hold 8 of the 12 elements"):
        _load({"w": torch.zeros(6, 2)}, weightcast.dcp.HuggingFaceStorageReader(
            tmp_path / "pieces", timeout=20, progress=False))
    with pytest.raises(weightcast.Error, match="HuggingFaceStorageReader") as e:
        weightcast.load(tmp_path / "pieces")
    assert e.value.status == 66


def test_bad_keywords_are_refused_when_the_reader_is_made(tmp_path):
    with pytest.raises(TypeError, match="placement"):
        weightcast.dcp.HuggingFaceStorageReader(tmp_path, placement="fsdp")
    with pytest.raises(weightcast.Error, match="timeout") as e:
        weightcast.dcp.HuggingFaceStorageReader(tmp_path, timeout=-1)
    assert e.value.status == 78
    with pytest.raises(weightcast.Error, match="thread_count") as e:
        weightcast.dcp.HuggingFaceStorageReader(tmp_path, thread_count=0)
    assert e.value.status == 64
    with pytest.raises(weightcast.Error, match="device") as e:
        weightcast.dcp.HuggingFaceStorageReader(tmp_path, device="tpu")
    assert e.value.status == 78
    # torch's keyword is taken
    assert weightcast.dcp.HuggingFaceStorageReader(tmp_path, thread_count=4).thread_count == 4


@pytest.fixture(scope="module")
def dcp_ranks(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("dcp_llama") / "llama"
    save_tiny_llama(checkpoint)
    out = tmp_path_factory.mktemp("dcp_ranks")
    ports = free_ports(8)
    r = run_ranks(HERE / "dcp_worker.py", [str(checkpoint), str(out)] + [str(p) for p in ports],
                  ranks=RANKS, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(RANKS)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fsdp2_on_2_ranks_matches_torchs_reader_bit_exact(dcp_ranks, dtype):
    for report in dcp_ranks:
        assert report[f"{dtype}_keys"], report["rank"]
        assert report[f"{dtype}_sharded"] > 0, report["rank"]  # DTensors, Shard(0)
        assert report[f"{dtype}_mismatch"] == [], report["rank"]


def test_rank_0_unable_to_open_fails_every_rank_with_its_message(dcp_ranks):
    for report in dcp_ranks:
        failures = report["missing_file"]
        assert failures is not None and sorted(failures) == [str(r) for r in range(RANKS)]
        for _, status, message in failures.values():
            assert "rank 0: no_such_checkpoint: no such file" in message


def test_shard_1_dtensors_match_torchs_reader_bit_exact(dcp_ranks):
    for report in dcp_ranks:
        assert report["shard1_count"] > 0
        assert report["shard1_mismatch"] == [], report["rank"]


def test_pieces_saved_by_torch_from_2_ranks_load_into_a_2d_mesh_and_back_bit_exact(dcp_ranks):
    for report in dcp_ranks:
        # A file per rank, as torch's writer names them; no index.
        assert report["pieces_1d_files"] == [
            f"shard-0000{r}-model-00001-of-00001.safetensors" for r in (1, 2)]
        for source in ("pieces_1d", "pieces_2d"):
            assert report[f"{source}_keys"] > 0, (report["rank"], source)
            assert report[f"{source}_mismatch"] == [], (report["rank"], source)


def test_load_refuses_a_directory_of_pieces_naming_the_dcp_reader(dcp_ranks):
    status, message = dcp_ranks[0]["pieces_load"]
    assert status == 66
    assert "weightcast.dcp.HuggingFaceStorageReader" in message
    assert "save_distributed=True" in message


def test_a_failure_in_read_data_is_weightcast_error_on_every_rank(dcp_ranks):
    for report in dcp_ranks:
        failures = report["read_data_failure"]
        assert failures is not None and sorted(failures) == [str(r) for r in range(RANKS)]
        for kind, status, message in failures.values():
            assert (kind, status) == ("Error", 78), message
            assert "other_checkpoint" in message


@pytest.fixture(scope="module")
def mesh_ranks(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("dcp_mesh") / "plain"
    checkpoint.mkdir()
    torch.manual_seed(9)
    # Rows that 4 divides (DTensor splits a strided shard evenly only); 9 columns split
    # unevenly.
    tensors = {"wq": torch.randn(8, 12), "w_up": torch.randn(16, 6), "odd": torch.randn(12, 9)}
    safetensors_torch.save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()},
                                str(checkpoint / "model.safetensors"))
    llama_dir = checkpoint.parent / "llama"
    save_tiny_llama(llama_dir)
    out = tmp_path_factory.mktemp("dcp_mesh_ranks")
    ports = free_ports(15)
    r = run_ranks(HERE / "dcp_mesh_worker.py", [str(checkpoint), str(llama_dir), str(out)] +
                  [str(p) for p in ports], ranks=4, timeout=180)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(4)]


@pytest.mark.parametrize("layout", ["shard0_shard1", "replicate_shard1", "shard1_shard0",
                                    "fsdp_over_tp"])
def test_a_2x2_mesh_matches_torchs_reader_bit_exact(mesh_ranks, layout):
    dtypes = ("bfloat16", "float32") if layout == "fsdp_over_tp" else ("float32",)
    for report in mesh_ranks:
        for dtype in dtypes:
            assert report[f"{layout}_{dtype}"] == [], (report["rank"], dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_tp_and_fsdp2_llama_on_a_2x2_mesh_matches_torchs_reader_bit_exact(mesh_ranks, dtype):
    # save_pretrained's Llama, ColwiseParallel/RowwiseParallel on the "tp" dim and fully_shard
    # on the "dp" dim; FP32 params from the BF16 checkpoint are cast at the receiver.
    for report in mesh_ranks:
        assert report[f"llama_tp_fsdp_{dtype}_keys"] == 21, report["rank"]
        assert report[f"llama_tp_fsdp_{dtype}_mismatch"] == [], report["rank"]
        placements = report[f"llama_tp_fsdp_{dtype}_placements"]
        assert placements["model.layers.0.self_attn.q_proj.weight"] == [
            "_StridedShard(0, split_factor=2)", "Shard(0)"], placements
        assert placements["model.layers.0.mlp.down_proj.weight"] == [
            "Shard(0)", "Shard(1)"], placements
        assert placements["model.layers.0.input_layernorm.weight"] == ["Shard(0)"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_load_into_a_tp_and_fsdp2_llama_on_a_2x2_mesh_matches_torchs_reader_bit_exact(
        mesh_ranks, dtype):
    # The strided shards (_StridedShard(0), Shard(0)) load as the boxes DCP reads into.
    for report in mesh_ranks:
        assert report[f"llama_tp_fsdp_{dtype}_load_into_mismatch"] == [], report["rank"]


def test_load_into_fsdp_over_tp_plain_tensors_matches_dtensors_split(mesh_ranks):
    for report in mesh_ranks:
        assert report["fsdp_over_tp_load_into"] == [], report["rank"]


def test_load_into_refuses_a_strided_shard_that_is_not_one_box(mesh_ranks):
    for report in mesh_ranks:
        status, message = report["interleaved"]
        assert status == 64, message
        assert "key 'wq'" in message and "not one box of the global tensor" in message, message


def test_fsdp2_on_a_1d_mesh_of_4_ranks_matches_torchs_reader_bit_exact(mesh_ranks):
    for report in mesh_ranks:
        assert report["llama_fsdp_1d_bfloat16_keys"] == 21, report["rank"]
        assert report["llama_fsdp_1d_bfloat16_mismatch"] == [], report["rank"]


def test_a_key_the_checkpoint_lacks_fails_every_rank_of_the_mesh_naming_it(mesh_ranks):
    for report in mesh_ranks:
        failures = report["llama_missing_key"]
        assert failures is not None and sorted(failures) == ["0", "1", "2", "3"], report
        for message in failures.values():
            assert "model.layers.0.mlp.not_in_checkpoint" in message, message
        assert report["llama_after_missing_key"], report["rank"]  # the next load works
