#include "text/utf8_stream.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace xpert {

namespace {

constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

enum class Scan { complete, invalid, incomplete };

// Looks at the character starting at bytes[0]. `size` is set to its length (complete), to the length
// of the maximal ill-formed subpart (invalid), or to the bytes available (incomplete).
Scan scan_one(std::string_view bytes, size_t& size) {
  const auto lead = static_cast<uint8_t>(bytes[0]);
  size_t length;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (lead < 0x80) {
    size = 1;
    return Scan::complete;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) lo = 0xA0;  // no overlong forms
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) lo = 0x90;  // no overlong forms
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    size = 1;  // continuation byte without a lead, C0, C1, F5..FF
    return Scan::invalid;
  }
  for (size_t k = 1; k < length; ++k) {
    if (k == bytes.size()) {
      size = k;
      return Scan::incomplete;
    }
    const auto b = static_cast<uint8_t>(bytes[k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      size = k;
      return Scan::invalid;
    }
  }
  size = length;
  return Scan::complete;
}

// Appends the valid characters of `bytes` to `out`, U+FFFD for ill-formed parts; returns how many
// trailing bytes form an incomplete character and were not consumed.
size_t assemble(std::string_view bytes, std::string& out) {
  size_t at = 0;
  while (at < bytes.size()) {
    // Fast path for ASCII runs.
    size_t ascii = at;
    while (ascii < bytes.size() && static_cast<uint8_t>(bytes[ascii]) < 0x80) ++ascii;
    out.append(bytes.data() + at, ascii - at);
    at = ascii;
    if (at == bytes.size()) break;
    size_t size = 0;
    switch (scan_one(bytes.substr(at), size)) {
      case Scan::complete:
        out.append(bytes.data() + at, size);
        break;
      case Scan::invalid:
        out += kReplacement;
        break;
      case Scan::incomplete:
        return size;
    }
    at += size;
  }
  return 0;
}

}  // namespace

std::string Utf8Assembler::push(std::string_view bytes) {
  std::string out;
  if (pending_.empty()) {
    const size_t tail = assemble(bytes, out);
    pending_.assign(bytes.substr(bytes.size() - tail));
    return out;
  }
  std::string joined = pending_;
  joined += bytes;
  const size_t tail = assemble(joined, out);
  pending_ = joined.substr(joined.size() - tail);
  return out;
}

std::string Utf8Assembler::flush() {
  std::string out;
  if (!pending_.empty()) out = kReplacement;  // the tail is one valid prefix, so one replacement
  pending_.clear();
  return out;
}

std::string sanitize_utf8(std::string_view bytes) {
  Utf8Assembler a;
  std::string out = a.push(bytes);
  return out + a.flush();
}

std::string Utf8Stream::push(int32_t id) {
  piece_.clear();
  tokenizer_.append_piece(id, special_, piece_);
  return assembler_.push(piece_);
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) continue;
    longest_ = std::max(longest_, stops[i].size());
    stops_.push_back(std::move(stops[i]));
    index_.push_back(i);
  }
}

StopMatcher::Step StopMatcher::push(std::string_view text) {
  Step step;
  if (stopped_) return step;
  held_ += text;

  // The earliest complete stop string wins (on a tie, the first listed).
  size_t best = std::string::npos, which = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t at = held_.find(stops_[i]);
    if (at < best) best = at, which = i;
  }
  if (best != std::string::npos) {
    step.text = held_.substr(0, best);
    step.stopped = true;
    step.stop_index = index_[which];
    stopped_ = true;
    held_.clear();
    return step;
  }

  // Hold back the longest tail that is a proper prefix of some stop string. Text released earlier
  // cannot be part of a later match: it would have been a longer such tail at the time.
  size_t keep = 0;
  for (size_t k = std::min(held_.size(), longest_ - (longest_ > 0)); k > 0 && keep == 0; --k) {
    const std::string_view tail = std::string_view(held_).substr(held_.size() - k);
    for (const std::string& s : stops_) {
      if (s.size() > k && s.compare(0, k, tail) == 0) {
        keep = k;
        break;
      }
    }
  }
  step.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return step;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace xpert
