// SentencePiece-style tokenization (tokenizer.ggml.model = "llama"), as llama.cpp does it:
// spaces become U+2581, the text is cut into UTF-8 characters, and the adjacent pair whose
// concatenation is the highest-scoring vocabulary piece is merged, again and again (equal scores:
// the leftmost pair first). A final symbol that is not a piece is spelled with byte tokens <0xXX>.
#include <algorithm>
#include <limits>
#include <queue>

#include "base/error.h"
#include "text/tokenizer_models.h"

namespace xpert {

namespace {

constexpr std::string_view kSpace = "\xe2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// Length of the UTF-8 sequence a lead byte announces, by its top four bits. Continuation and invalid
// bytes count as one; a sequence cut off by the end of the text is shortened by the caller.
size_t utf8_sequence_length(uint8_t lead) {
  static constexpr uint8_t kLength[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLength[lead >> 4];
}

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(Vocab&& vocab) : Tokenizer(std::move(vocab)) {}

 protected:
  void encode_text(std::string_view raw, bool after_special, std::vector<int32_t>& out) const override;
  void append_normal_piece(int32_t id, std::string& out) const override;
};

struct Symbol {
  int32_t prev, next;    // neighbours in the current segmentation, -1 at the ends
  uint32_t begin, size;  // bytes of the escaped text; size 0 once merged into the left neighbour
};

struct Bigram {
  float score;
  int32_t left, right;
  uint32_t size;  // left.size + right.size when queued; a mismatch later means the pair is stale
};

// Max-heap order: higher score first; on equal scores the leftmost pair first.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

void SpmTokenizer::encode_text(std::string_view raw, bool after_special, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 4 + 3);
  if (add_space_prefix_ && after_special) text += kSpace;
  for (char c : raw) {
    if (c == ' ') {
      text += kSpace;
    } else {
      text += c;
    }
  }
  if (text.size() > std::numeric_limits<uint32_t>::max() / 2)
    fail("text too long to tokenize ({} bytes)", raw.size());

  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    const size_t size = std::min(utf8_sequence_length(static_cast<uint8_t>(text[at])), text.size() - at);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, at + size == text.size() ? -1 : index + 1, static_cast<uint32_t>(at),
                       static_cast<uint32_t>(size)});
    at += size;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left == -1 || right == -1) return;
    const uint32_t size = symbols[left].size + symbols[right].size;
    const int32_t id = lookup(std::string_view(text).substr(symbols[left].begin, size));
    if (id == kNoToken) return;
    queue.push({token_score(id), left, right, size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);

  while (!queue.empty()) {
    const Bigram top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.size == 0 || right.size == 0 || left.size + right.size != top.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next != -1) symbols[right.next].prev = top.left;
    try_pair(left.prev, top.left);
    try_pair(top.left, left.next);
  }

  // Every merged symbol is a piece by construction; only single characters can be missing.
  for (int32_t i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = std::string_view(text).substr(symbols[i].begin, symbols[i].size);
    const int32_t id = lookup(piece);
    if (id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t b = byte_token(static_cast<uint8_t>(c));
      if (b == kNoToken)
        fail("the vocabulary has no token for byte 0x{:02X} and no unknown token", static_cast<uint8_t>(c));
      out.push_back(b);
    }
  }
}

void SpmTokenizer::append_normal_piece(int32_t id, std::string& out) const {
  const std::string_view text = token_text(id);
  for (size_t at = 0; at < text.size();) {
    if (text.compare(at, kSpace.size(), kSpace) == 0) {
      out += ' ';
      at += kSpace.size();
    } else {
      out += text[at++];
    }
  }
}

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab&& vocab) {
  return std::make_unique<SpmTokenizer>(std::move(vocab));
}

}  // namespace xpert
