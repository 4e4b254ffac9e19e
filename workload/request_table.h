// RequestTable: a workload's requests in packed columns (16 bytes a request when every request
// has the same n, beam width and no prefix group), read back as RequestSpec values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

#include "workload/request_spec.h"

namespace memsim {

// The requests of a workload in arrival order. Arrival, prompt and output tokens are stored per
// request; every other field of RequestSpec lives in a column that holds one shared value until
// a request differs from it (then it stores one value per request). A request's id is its index
// unless some request was added with another id (then the ids are stored too). Reading request
// i gives back exactly the RequestSpec that was added at i.
class RequestTable {
 public:
  // Bytes a request costs when the optional columns hold one shared value.
  static constexpr uint64_t kBytesPerRequest = sizeof(SimTime) + 2 * sizeof(uint32_t);

  RequestTable() = default;
  explicit RequestTable(const std::vector<RequestSpec>& requests);

  size_t size() const { return arrival_.size(); }
  bool empty() const { return arrival_.empty(); }
  void reserve(size_t n);
  // Frees spare capacity (copies the columns: peak memory is briefly twice their size).
  void shrink_to_fit();
  void push_back(const RequestSpec& r);

  RequestSpec operator[](size_t i) const;
  RequestSpec front() const { return (*this)[0]; }
  RequestSpec back() const { return (*this)[size() - 1]; }
  SimTime arrival(size_t i) const { return arrival_[i]; }
  uint32_t prompt_tokens(size_t i) const { return prompt_[i]; }
  uint32_t output_tokens(size_t i) const { return output_[i]; }
  void set_arrival(size_t i, SimTime t) { arrival_[i] = t; }
  // Whether some request has n > 1 or beam_width > 1.
  bool any_parallel() const { return n_.max() > 1 || beam_width_.max() > 1; }
  // Reorders the requests by arrival, keeping the order of equal arrivals (std::stable_sort).
  // renumber: afterwards every id is its new index (a trace's rows are numbered once sorted);
  // else each request keeps its id.
  void stable_sort_by_arrival(bool renumber);
  // Bytes the columns hold (capacity included).
  uint64_t bytes() const;
  std::vector<RequestSpec> to_vector() const;

  // Iterates by value: `for (const RequestSpec& r : table)` binds each request in turn.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = RequestSpec;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = RequestSpec;
    Iterator(const RequestTable* t, size_t i) : t_(t), i_(i) {}
    RequestSpec operator*() const { return (*t_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    Iterator operator++(int) {
      Iterator old = *this;
      ++i_;
      return old;
    }
    friend bool operator==(const Iterator& a, const Iterator& b) { return a.i_ == b.i_; }

   private:
    const RequestTable* t_;
    size_t i_;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size()}; }

  friend bool operator==(const RequestTable& a, const RequestTable& b);

 private:
  // One value shared by every request until one differs, then a value per request.
  template <class T>
  class Column {
   public:
    explicit Column(T shared) : shared_(shared), max_(shared) {}
    T at(size_t i) const { return values_.empty() ? shared_ : values_[i]; }
    T max() const { return max_; }
    bool packed() const { return values_.empty(); }
    // Adds the value of request `index` (== the number of values added before); `capacity`:
    // the requests the table has room for (reserved when the column starts storing values).
    void push(size_t index, T v, size_t capacity);
    void reserve(size_t n) {
      if (!values_.empty()) values_.reserve(n);
    }
    void shrink_to_fit() { values_.shrink_to_fit(); }
    void permute(const std::vector<uint32_t>& order);
    uint64_t bytes() const { return values_.capacity() * sizeof(T); }

   private:
    T shared_;
    T max_;
    std::vector<T> values_;
  };

  std::vector<SimTime> arrival_;
  std::vector<uint32_t> prompt_, output_;
  std::vector<uint64_t> ids_;  // empty while every id equals its index
  Column<int32_t> prefix_group_{-1};
  Column<uint32_t> prefix_tokens_{0};
  Column<uint32_t> n_{1};
  Column<uint32_t> beam_width_{1};
};

}  // namespace memsim
