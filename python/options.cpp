// The keywords of a Python load as the library's options (options.hpp): the device, the
// config file, and the keywords as overrides of its keys.

#include "options.hpp"

#include "weightcast/control/world.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"

#include <fmt/core.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weightcast::python {

DeviceKind parse_device_kind(const std::string& kind) {
  if (const auto parsed = device_kind(kind)) return *parsed;
  throw Error(Errc::config, "device: '" + kind + "' is not a device (cpu, cuda, cuda:N)");
}

Config effective_config(const PyOptions& o) {
  std::vector<std::string> overrides;
  overrides.reserve(o.overrides.size());
  for (const auto& [key, value] : o.overrides) {
    overrides.push_back(fmt::format("{}={}", key, value));
  }
  Config config = load_config(o.config.value_or(std::string()), overrides, "keyword");
  // A second layer with its own origin, so that the world knows it came from the group.
  std::vector<std::string> group;
  group.reserve(o.group_overrides.size());
  for (const auto& [key, value] : o.group_overrides) {
    group.push_back(fmt::format("{}={}", key, value));
  }
  apply_overrides(config, group, process_group_origin);
  return config;
}

Config with_rendezvous_port(Config config, std::optional<int> port) {
  if (port) {
    const Config checked =
        load_config(std::string(), {fmt::format("rendezvous.port={}", *port)}, "keyword");
    config.rendezvous_port = checked.rendezvous_port;
    config.set_at.insert_or_assign("rendezvous.port", "keyword");
  }
  return config;
}

}  // namespace weightcast::python
