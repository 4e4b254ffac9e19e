// RequestTable's columns: shared values that turn into per-request values on the first request
// that differs, a stable reorder by arrival, and conversion from and to RequestSpec vectors.
#include "workload/request_table.h"

#include <algorithm>
#include <numeric>

namespace memsim {

template <class T>
void RequestTable::Column<T>::push(size_t index, T v, size_t capacity) {
  max_ = index == 0 ? v : std::max(max_, v);
  if (values_.empty()) {
    if (index == 0) shared_ = v;
    if (v == shared_) return;
    values_.reserve(std::max(capacity, index + 1));
    values_.assign(index, shared_);
  }
  values_.push_back(v);
}

template <class T>
void RequestTable::Column<T>::permute(const std::vector<uint32_t>& order) {
  if (values_.empty()) return;
  std::vector<T> sorted(values_.size());
  for (size_t i = 0; i < order.size(); ++i) sorted[i] = values_[order[i]];
  values_ = std::move(sorted);
}

RequestTable::RequestTable(const std::vector<RequestSpec>& requests) {
  reserve(requests.size());
  for (const RequestSpec& r : requests) push_back(r);
}

void RequestTable::reserve(size_t n) {
  arrival_.reserve(n);
  prompt_.reserve(n);
  output_.reserve(n);
  if (!ids_.empty()) ids_.reserve(n);
  prefix_group_.reserve(n);
  prefix_tokens_.reserve(n);
  n_.reserve(n);
  beam_width_.reserve(n);
}

void RequestTable::shrink_to_fit() {
  arrival_.shrink_to_fit();
  prompt_.shrink_to_fit();
  output_.shrink_to_fit();
  ids_.shrink_to_fit();
  prefix_group_.shrink_to_fit();
  prefix_tokens_.shrink_to_fit();
  n_.shrink_to_fit();
  beam_width_.shrink_to_fit();
}

void RequestTable::push_back(const RequestSpec& r) {
  const size_t i = size();
  const size_t capacity = arrival_.capacity();
  if (!ids_.empty() || r.id != i) {
    if (ids_.empty()) {  // the first id that is not its index: store them all from now on
      ids_.reserve(std::max(capacity, i + 1));
      for (size_t k = 0; k < i; ++k) ids_.push_back(k);
    }
    ids_.push_back(r.id);
  }
  arrival_.push_back(r.arrival);
  prompt_.push_back(r.prompt_tokens);
  output_.push_back(r.output_tokens);
  prefix_group_.push(i, r.prefix_group, capacity);
  prefix_tokens_.push(i, r.prefix_tokens, capacity);
  n_.push(i, r.n, capacity);
  beam_width_.push(i, r.beam_width, capacity);
}

RequestSpec RequestTable::operator[](size_t i) const {
  RequestSpec r;
  r.id = ids_.empty() ? i : ids_[i];
  r.arrival = arrival_[i];
  r.prompt_tokens = prompt_[i];
  r.output_tokens = output_[i];
  r.prefix_group = prefix_group_.at(i);
  r.prefix_tokens = prefix_tokens_.at(i);
  r.n = n_.at(i);
  r.beam_width = beam_width_.at(i);
  return r;
}

void RequestTable::stable_sort_by_arrival(bool renumber) {
  if (std::is_sorted(arrival_.begin(), arrival_.end())) {
    if (renumber) ids_ = {};
    return;
  }
  std::vector<uint32_t> order(size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return arrival_[a] < arrival_[b]; });
  const auto permute = [&](auto& column) {
    using T = typename std::decay_t<decltype(column)>::value_type;
    std::vector<T> sorted(column.size());
    for (size_t i = 0; i < order.size(); ++i) sorted[i] = column[order[i]];
    column = std::move(sorted);
  };
  permute(arrival_);
  permute(prompt_);
  permute(output_);
  if (renumber) {
    ids_ = {};
  } else {
    if (ids_.empty()) {  // ids equal to the old indices move with their requests
      ids_.resize(size());
      std::iota(ids_.begin(), ids_.end(), uint64_t{0});
    }
    permute(ids_);
  }
  prefix_group_.permute(order);
  prefix_tokens_.permute(order);
  n_.permute(order);
  beam_width_.permute(order);
}

uint64_t RequestTable::bytes() const {
  return arrival_.capacity() * sizeof(SimTime) + prompt_.capacity() * sizeof(uint32_t) +
         output_.capacity() * sizeof(uint32_t) + ids_.capacity() * sizeof(uint64_t) +
         prefix_group_.bytes() + prefix_tokens_.bytes() + n_.bytes() + beam_width_.bytes();
}

std::vector<RequestSpec> RequestTable::to_vector() const {
  std::vector<RequestSpec> out;
  out.reserve(size());
  for (size_t i = 0; i < size(); ++i) out.push_back((*this)[i]);
  return out;
}

bool operator==(const RequestTable& a, const RequestTable& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}

}  // namespace memsim
