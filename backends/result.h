// Error values for every fallible call in memsim: Error, Result<T> and Status (no exceptions
// cross the Backend boundary, and out-of-memory is a value the caller reports).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace memsim {

enum class ErrorCode : uint8_t {
  kOutOfMemory,      // physical memory or VA space exhausted (a reportable outcome)
  kInvalidArgument,  // bad size, alignment, unknown handle or pointer
  kInvalidState,     // misuse: double release, unmap of an unmapped range, map over a mapping
  kNotSupported,     // the backend lacks the primitive (e.g. CUDA in a CPU-only build)
  kDriverError,      // the CUDA driver or runtime failed (message carries call + error string)
};

const char* to_string(ErrorCode code);

struct Error {
  ErrorCode code;
  std::string message;
  uint64_t bytes_short = 0;  // for kOutOfMemory: how many bytes the request lacked
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  const T& value() const& { return std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return err_; }

 private:
  Error err_{ErrorCode::kInvalidState, {}};
  bool ok_ = true;
};

using Status = Result<void>;

inline Error make_error(ErrorCode code, std::string message, uint64_t bytes_short = 0) {
  return Error{code, std::move(message), bytes_short};
}

}  // namespace memsim

// Propagate an error from a Status/Result expression; evaluates the expression once.
#define MEMSIM_TRY(expr)                                             \
  do {                                                               \
    auto memsim_try_result_ = (expr);                                \
    if (!memsim_try_result_.ok()) return memsim_try_result_.error(); \
  } while (0)

#define MEMSIM_CONCAT_INNER(a, b) a##b
#define MEMSIM_CONCAT(a, b) MEMSIM_CONCAT_INNER(a, b)
// Assign the value of a Result expression to `lhs`, or return its error.
#define MEMSIM_ASSIGN_OR_RETURN(lhs, expr) \
  MEMSIM_ASSIGN_OR_RETURN_IMPL(MEMSIM_CONCAT(memsim_res_, __LINE__), lhs, expr)
#define MEMSIM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.error();                 \
  lhs = std::move(tmp).value()
