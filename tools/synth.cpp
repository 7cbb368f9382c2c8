#include "commands.hpp"

#include "weightcast/error.hpp"

namespace weightcast::cli {
int synth(const SynthArgs&) { throw Error(Errc::internal, "synth: not implemented yet"); }
}  // namespace weightcast::cli
