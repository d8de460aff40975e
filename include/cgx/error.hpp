#pragma once
/// \file error.hpp
/// The one exception type of the library.

#include <stdexcept>
#include <string>

namespace cgx {

/// What went wrong, for callers that want to branch on it.
enum class errc {
  invalid_argument,  ///< a null buffer, a count above the plan's capacity, a bad option, a capacity whose sizes overflow
  mismatch,          ///< ranks disagree on a collective's arguments (count, type, quantizer)
  workspace,         ///< a caller-supplied workspace is too small for this plan, or the plan's own cannot be allocated
  communicator,      ///< a null or unusable communicator, or one of the wrong size
  transport,         ///< the transport (MPI, CUDA, ...) reported a failure
  cuda,              ///< a CUDA runtime call failed
  corrupt,           ///< a received message is malformed or fails its integrity check
  peer_failed,       ///< another rank failed inside this collective call (it told this rank so)
  timeout,           ///< a wait exceeded plan_options::timeout_ms (the message names the ranks waited for)
};

/// Thrown by every host entry point of cgx on bad input or a failed transport.
/// When an allreduce throws before moving data, the caller's buffer is untouched.
class error : public std::runtime_error {
 public:
  /// An error of category `code`; what() returns "cgx: " followed by `what`.
  error(errc code, const std::string& what) : std::runtime_error("cgx: " + what), code_(code) {}
  /// The category of the failure.
  [[nodiscard]] errc code() const noexcept { return code_; }

 private:
  errc code_;
};

}  // namespace cgx
