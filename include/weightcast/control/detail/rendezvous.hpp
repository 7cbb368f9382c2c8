/**
 * @file control/detail/rendezvous.hpp
 * @brief The start of the control plane (`ControlPlane`'s constructor): rank 0 accepts a
 *        connection from every other rank; each other rank connects to rank 0. Boost.Asio
 *        inside: only control/'s sources include this header.
 *
 * Each returns the connected sockets on @p io, the session's io_context, and throws what
 * `ControlPlane::ControlPlane` documents (control_plane.hpp).
 */
#pragma once

#include "weightcast/control/control_plane.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <optional>
#include <vector>

namespace weightcast::detail {

/// Rank 0: listens on the options' address and accepts every other rank's hello.
/// @return each peer's connection on @p io, indexed by rank (index 0 empty).
std::vector<std::optional<boost::asio::ip::tcp::socket>> accept_peers(
    boost::asio::io_context& io, const World& world, const RendezvousOptions& options);

/// A rank other than 0: connects to rank 0, retrying with backoff, and presents its hello.
/// @return the connection to rank 0, on @p io.
boost::asio::ip::tcp::socket connect_to_root(boost::asio::io_context& io, const World& world,
                                             const RendezvousOptions& options);

}  // namespace weightcast::detail
