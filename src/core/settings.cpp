// The config spellings of the shared kinds (settings.hpp), which `Config::to_yaml` prints and
// the YAML loader reads back.
#include "weightcast/core/settings.hpp"

namespace weightcast {

std::string_view to_string(DeviceKind kind) noexcept {
  switch (kind) {
    case DeviceKind::automatic: return "auto";
    case DeviceKind::host: return "host";
    case DeviceKind::cuda: return "cuda";
  }
  return "auto";
}

std::string_view to_string(TransportKind kind) noexcept {
  switch (kind) {
    case TransportKind::automatic: return "auto";
    case TransportKind::local: return "local";
    case TransportKind::mpi: return "mpi";
    case TransportKind::nccl: return "nccl";
  }
  return "auto";
}

std::string_view to_string(DirectIo mode) noexcept {
  switch (mode) {
    case DirectIo::automatic: return "auto";
    case DirectIo::on: return "on";
    case DirectIo::off: return "off";
  }
  return "auto";
}

std::string_view to_string(ReaderKind kind) noexcept {
  switch (kind) {
    case ReaderKind::automatic: return "auto";
    case ReaderKind::uring: return "uring";
    case ReaderKind::pread: return "pread";
  }
  return "auto";
}

std::string_view to_string(Destination destination) noexcept {
  switch (destination) {
    case Destination::arena: return "arena";
    case Destination::discard: return "discard";
  }
  return "arena";
}

std::string_view to_string(Verify verify) noexcept {
  switch (verify) {
    case Verify::none: return "none";
    case Verify::digest: return "digest";
  }
  return "digest";
}

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "info";
}

}  // namespace weightcast
