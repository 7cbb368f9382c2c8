#include "commands.hpp"

#include "weightcast/error.hpp"

namespace weightcast::cli {
int run(const RunArgs&) { throw Error(Errc::internal, "run: not implemented yet"); }
}  // namespace weightcast::cli
