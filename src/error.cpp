#include "specdec/error.hpp"

namespace specdec::detail {
void throw_error(const std::string& message) { throw Error(message); }
}  // namespace specdec::detail
