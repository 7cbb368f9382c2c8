#include "commands.hpp"

#include "weightcast/error.hpp"

namespace weightcast::cli {
int inspect(const InspectArgs&) { throw Error(Errc::internal, "inspect: not implemented yet"); }
}  // namespace weightcast::cli
