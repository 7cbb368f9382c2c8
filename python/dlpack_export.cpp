// DLPack export (dlpack_export.hpp): how each safetensors dtype crosses DLPack, and the
// tensors of a finished load as DLPack tensors viewing its arena.

#include "dlpack_export.hpp"

#include "weightcast/device/device.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/plan/placement.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weightcast::python {

std::atomic<long> live_arenas{0};

namespace {

// Dimensions a tensor may cross DLPack with as it is (see py_tensors).
constexpr std::size_t kMaxExportDims = 64;

struct OwnedArena {
  std::shared_ptr<Arena> arena;
  explicit OwnedArena(std::shared_ptr<Arena> a) : arena(std::move(a)) { ++live_arenas; }
  ~OwnedArena() { --live_arenas; }
  OwnedArena(const OwnedArena&) = delete;
  OwnedArena& operator=(const OwnedArena&) = delete;
};

// How a safetensors dtype crosses DLPack. Types DLPack and every torch >= 2.3 agree on go
// with their own code; the F8 and F4 types go as uint8 of the same bytes and the Python side
// views them as torch's dtype (a same-size `Tensor.view(dtype)`), since torch's DLPack
// import learnt the float8 codes only recently. `bytes_per_element` is the exported
// element's size.
struct Export {
  nb::dlpack::dtype dtype;
  bool packed_f4 = false;  // F4: two elements per uint8, the last dimension halved
  bool raw = false;        // F6: no element type at all; a 1-D uint8 of the tensor's bytes
};

Export export_of(Dtype dtype) {
  using nb::dlpack::dtype_code;
  auto dt = [](dtype_code code, int bits) {
    return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
  };
  switch (dtype) {
    case Dtype::BOOL: return {dt(dtype_code::Bool, 8)};
    case Dtype::U8: return {dt(dtype_code::UInt, 8)};
    case Dtype::I8: return {dt(dtype_code::Int, 8)};
    case Dtype::I16: return {dt(dtype_code::Int, 16)};
    case Dtype::U16: return {dt(dtype_code::UInt, 16)};
    case Dtype::F16: return {dt(dtype_code::Float, 16)};
    case Dtype::BF16: return {dt(dtype_code::Bfloat, 16)};
    case Dtype::I32: return {dt(dtype_code::Int, 32)};
    case Dtype::U32: return {dt(dtype_code::UInt, 32)};
    case Dtype::F32: return {dt(dtype_code::Float, 32)};
    case Dtype::C64: return {dt(dtype_code::Complex, 64)};
    case Dtype::F64: return {dt(dtype_code::Float, 64)};
    case Dtype::I64: return {dt(dtype_code::Int, 64)};
    case Dtype::U64: return {dt(dtype_code::UInt, 64)};
    case Dtype::F8_E5M2:
    case Dtype::F8_E4M3:
    case Dtype::F8_E8M0:
    case Dtype::F8_E4M3FNUZ:
    case Dtype::F8_E5M2FNUZ: return {dt(dtype_code::UInt, 8)};
    case Dtype::F4: return {dt(dtype_code::UInt, 8), true, false};
    case Dtype::F6_E2M3:
    case Dtype::F6_E3M2: return {dt(dtype_code::UInt, 8), false, true};
  }
  return {dt(dtype_code::UInt, 8), false, true};
}

}  // namespace

nb::list py_tensors(PyLoadResult& r) {
  LoadResult& result = checked(r);
  auto* owned = new OwnedArena(result.arena);
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<OwnedArena*>(p); });
  const bool cuda = result.arena->kind() == MemoryKind::cuda;
  int device_id = 0;
  if (cuda) {
    // "cuda:N"
    const std::string& name = result.stats.device;
    device_id = std::stoi(name.substr(name.find(':') + 1));
  }
  const int device_type = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  // Tensors of zero bytes still need a pointer DLPack accepts; any aligned address will do
  // (nothing is ever read through it), so use the arena's base or a static byte.
  alignas(256) static std::byte empty_tensor_storage[1];

  nb::list out;
  // A placed load (placement fsdp on several ranks) holds this rank's local shards only.
  const std::size_t count =
      result.placed ? result.wants.tensors.size() : result.catalogue.tensors.size();
  for (std::size_t i = 0; i < count; ++i) {
    const TensorView view = result.placed ? result.local(i) : result.tensor(i);
    const TensorInfo& info = *view.info;
    const Export e = export_of(info.dtype);
    const std::vector<std::uint64_t> local =
        view.want != nullptr ? local_shape(info, *view.want) : info.shape;
    const std::uint64_t bytes = view.want != nullptr ? local_bytes(info, *view.want) : info.bytes;
    std::vector<std::size_t> shape(local.begin(), local.end());
    // F4 with an odd last dimension (or a scalar) has no float4_e2m1fn_x2 shape: it goes as
    // raw bytes like F6; `weightcast.load` refuses it up front unless asked for bytes.
    const bool f4_pairs = e.packed_f4 && !shape.empty() && shape.back() % 2 == 0;
    if (e.raw || (e.packed_f4 && !f4_pairs)) {
      shape = {static_cast<std::size_t>(bytes)};
    } else if (e.packed_f4) {
      shape.back() /= 2;
    }
    // nanobind's DLPack export aborts the process (a "critical error") somewhere past 128
    // dimensions, while safetensors and torch take any count: a tensor of many dimensions goes
    // flat and the Python side views it in its shape (`weightcast._dtypes.as_torch`).
    if (shape.size() > kMaxExportDims) {
      shape = {static_cast<std::size_t>(bytes / (e.dtype.bits / 8))};
    }
    void* data = view.data != nullptr ? static_cast<void*>(view.data)
                 : cuda && result.arena->data() != nullptr
                     ? static_cast<void*>(result.arena->data())
                     : static_cast<void*>(empty_tensor_storage);
    // Contiguous strides as torch computes them: a zero-size dimension counts as 1, so a
    // [2, 0, 3] tensor has strides [3, 3, 1] like torch.empty(2, 0, 3).
    std::vector<std::int64_t> strides(shape.size());
    std::int64_t stride = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= std::max<std::int64_t>(static_cast<std::int64_t>(shape[d]), 1);
    }
    nb::ndarray<nb::pytorch> array(data, shape.size(), shape.data(), owner, strides.data(),
                                   e.dtype, device_type, device_id);
    out.append(nb::make_tuple(info.name, std::string(dtype_name(info.dtype)),
                              nb::cast(array, nb::rv_policy::reference),
                              nb::tuple(nb::cast(local))));
  }
  r.result->arena.reset();
  return out;
}

}  // namespace weightcast::python
