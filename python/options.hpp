// The keywords of a Python load as the library's options: the config file's, then each
// keyword given; and the check of the result, naming the keyword the caller wrote.
#pragma once

#include "weightcast/config/config.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace weightcast::python {

/// The device a Python load names ("cpu" or "host", "cuda"; the ordinal comes apart): the
/// settings registry's spellings (`device_kind`).
/// @throws Error `config` (78) for any other.
DeviceKind parse_device_kind(const std::string& kind);

/// Options of one Python load: a config file's (if any), then each keyword given, as its
/// config key and the text of its value, in the order the caller checks them (the keyword's
/// Python type checked in _options.py; its value checked by the config, against the settings
/// registry).
struct PyOptions {
  std::optional<std::string> config;
  std::vector<std::pair<std::string, std::string>> overrides;  ///< key, value as text
  /// Keys a torch process group gives (`world.*`, `rendezvous.*`), set after `overrides`
  /// with `process_group_origin` (world.hpp) as where they were set.
  std::vector<std::pair<std::string, std::string>> group_overrides;
};

/// A Python call's configuration, read once (`weightcast._weightcast.Settings`): the config
/// file's keys, then the keywords over them (`effective_config`). The world, the config's
/// device and the load all take it, so a `config=` file is read once per call.
struct PySettings {
  Config config;
};

/// The configuration of one Python load: the config file's keys (the defaults without one),
/// then each keyword given over them, as an override of its config key: each value's rule and
/// message are the config's, the same as from a file or `--set` ("keyword chunk_size=0: '0' is out of range (must be more than 0 and at
/// most 4GiB)").
/// @throws Error `config` (78) for a bad value; what `load_config` throws for the file.
Config effective_config(const PyOptions& o);

/// @return @p config with `rendezvous.port` set from the keyword @p port (the config key's
///         rule and message, as for the other keywords); @p config itself without one.
Config with_rendezvous_port(Config config, std::optional<int> port);

}  // namespace weightcast::python
