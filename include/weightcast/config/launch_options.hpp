/**
 * @file launch_options.hpp
 * @brief The launcher's `Config` turned into the plain options of the layers below it: the
 *        world it asks for (`world.*`) and where the ranks meet (`rendezvous.*`). The control
 *        layer takes only those options, never a `Config`.
 */
#pragma once

#include "weightcast/config/config.hpp"
#include "weightcast/control/control_plane.hpp"
#include "weightcast/control/world.hpp"

namespace weightcast {

/// @return what @p config asks of this process's place: `world.rank`, `world.size`,
///         `world.local_rank`, where the first two were set (`Config::where_set`), and whether
///         `rendezvous.address` is set. Never throws.
[[nodiscard]] WorldRequest world_request(const Config& config);

/**
 * @brief This process's world: `detect_world(world_request(config))` (control/world.hpp).
 * @throws Error as `detect_world(const WorldRequest&)` does, naming the config file and line
 *         (or `--set`) of a `world.*` key at fault.
 */
World detect_world(const Config& config);

/// @return the options of `config`: address `rendezvous.address`, else `$MASTER_ADDR`
///         (`world.master_addr`), else rank 0's host as the launcher knows it
///         (`world.root_host`, found only for a world that spans hosts), else 127.0.0.1
///         (an IPv6 address in brackets, "[::1]", as
///         RFC 3986 writes it beside a port, loses them); port `rendezvous.port`; token
///         `rendezvous.token`, else `$WEIGHTCAST_TOKEN`, else none; timeout `timeout`; the
///         job id of @p world. Never throws a weightcast `Error` (nothing is checked here).
RendezvousOptions rendezvous_options(const Config& config, const World& world);

}  // namespace weightcast
