// The launcher's Config as the control layer's plain options: the world it asks for and
// where the ranks meet.
#include "weightcast/config/launch_options.hpp"

#include <cstdlib>

namespace weightcast {

WorldRequest world_request(const Config& config) {
  WorldRequest request;
  request.rank = config.world_rank;
  request.world_size = config.world_size;
  request.local_rank = config.world_local_rank;
  request.rank_set_at = std::string(config.where_set("world.rank"));
  request.size_set_at = std::string(config.where_set("world.size"));
  request.rendezvous_address_given = !config.rendezvous_address.empty();
  return request;
}

World detect_world(const Config& config) { return detect_world(world_request(config)); }

RendezvousOptions rendezvous_options(const Config& config, const World& world) {
  RendezvousOptions options;
  if (!config.rendezvous_address.empty()) {
    options.address = config.rendezvous_address;
    options.address_source = "rendezvous.address";
  } else if (!world.master_addr.empty()) {
    options.address = world.master_addr;
    options.address_source = "MASTER_ADDR";
  } else if (!world.root_host.empty()) {
    options.address = world.root_host;
    options.address_source = world.root_host_source;
  }
  options.spans_hosts = world.spans_hosts;
  // "[::1]", as an IPv6 address is written beside a port (RFC 3986), is the address ::1.
  if (options.address.size() > 2 && options.address.front() == '[' &&
      options.address.back() == ']') {
    options.address = options.address.substr(1, options.address.size() - 2);
  }
  options.port = config.rendezvous_port;
  options.token = config.rendezvous_token;
  if (options.token.empty()) {
    if (const char* token = std::getenv("WEIGHTCAST_TOKEN")) options.token = token;
  }
  options.timeout = config.timeout;
  options.job_id = world.job_id;
  options.job_id_source = world.job_id_source;
  return options;
}

}  // namespace weightcast
