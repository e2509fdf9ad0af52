#include "core/data/tokenizers/bpe.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/data/tokenizers/regex_splitter.h"
#include "core/util/status.h"
#include "core/util/thread_pool.h"
#include "core/util/utf8.h"

namespace dtrain {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 onwards, in byte order.
std::array<char32_t, 256> ByteToCodepoint() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

// A text is cut for parallel encoding only in pieces of at least this size, where the cost of
// a task is far above the cost of starting it.
constexpr size_t kParallelChunkBytes = 256 * 1024;
// Pieces up to this size are remembered per thread (words repeat; merging them is the cost).
constexpr size_t kCachedPieceBytes = 64;
constexpr size_t kCacheEntries = 1 << 16;
// Token ids a vocabulary may use: its tables hold an entry for each id up to the largest.
constexpr int32_t kMaxTokenIds = 1 << 24;

std::atomic<uint64_t> next_tokenizer_serial{1};

struct PieceCache {
  uint64_t owner = 0;  // the serial of the tokenizer whose ids these are
  absl::flat_hash_map<std::string, std::vector<int32_t>> ids;
};

struct Merge {
  int32_t rank;
  int32_t id;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Debian's Abseil has its own string_view class.
absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

std::vector<AddedToken> WithNormalizedContents(std::vector<AddedToken> tokens,
                                               const Normalizer& normalizer) {
  if (!normalizer.empty()) {
    for (AddedToken& token : tokens) token.content = normalizer.Apply(token.content);
  }
  return tokens;
}

bool IsAsciiSpace(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool IsAsciiLetter(unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

class Bpe final : public Tokenizer {
 public:
  std::string name() const override { return name_; }
  int vocab_size() const override { return static_cast<int>(id_bytes_.size()); }

  absl::Status Encode(std::string_view text, std::vector<int32_t>* ids) const override {
    if (!byte_level_ && !byte_fallback_) {
      if (const size_t bad = FirstInvalidUtf8Byte(View(text)); bad != std::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            DescribeInvalidUtf8(View(text)), " (byte offset ", bad, " of the text); tokenizer ",
            name_,
            " has no byte_fallback, so it encodes UTF-8 only: fix or drop that text, or use a "
            "tokenizer with byte fallback or a byte-level one, which encode any bytes"));
      }
    }
    std::vector<TextPiece> stretches;
    special_.Split(text, &stretches);
    for (const TextPiece& stretch : stretches) {
      if (stretch.id != TextPiece::kPlainText) {
        ids->push_back(stretch.id);
        continue;
      }
      // Hugging Face normalizes the stretches between special tokens, then finds the other
      // added tokens in the normalized text.
      std::string normalized;
      std::string_view plain = stretch.text;
      if (!normalizer_.empty()) {
        normalized = normalizer_.Apply(plain);
        plain = normalized;
      }
      const bool at_text_start = stretch.text.data() == text.data();
      std::vector<TextPiece> pieces;
      if (normal_.empty()) {
        if (!plain.empty()) pieces.push_back({plain, TextPiece::kPlainText});
      } else {
        normal_.Split(plain, &pieces);
      }
      for (const TextPiece& piece : pieces) {
        if (piece.id != TextPiece::kPlainText) {
          ids->push_back(piece.id);
        } else {
          RETURN_IF_ERROR(
              EncodePlain(piece.text, at_text_start && piece.text.data() == plain.data(), ids));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int32_t> SpecialToken(std::string_view text) const override {
    const auto it = added_ids_.find(View(text));
    if (it != added_ids_.end()) return it->second;
    std::vector<std::string> known;
    for (const auto& [content, id] : added_ids_) {
      if (known.size() < 8) known.push_back(content);
    }
    std::sort(known.begin(), known.end());
    return absl::NotFoundError(absl::StrCat(
        "tokenizer ", name_, " has no special token '", absl::CHexEscape(View(text)), "'",
        known.empty() ? std::string(" (it has none)")
                      : absl::StrCat(" (it has ", absl::StrJoin(known, ", "),
                                     added_ids_.size() > known.size() ? ", ..." : "", ")")));
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    std::vector<std::string> tokens;
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size() || !known_[id]) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", id,
                                                       " is not in the vocabulary of tokenizer ",
                                                       name_, " (size ", vocab_size(), ")"));
      }
      tokens.push_back(id_bytes_[id]);
    }
    return DecodeTokens(decoder_, std::move(tokens));
  }

  static absl::StatusOr<std::unique_ptr<Tokenizer>> Make(BpeSpec spec, int threads) {
    auto bpe = std::unique_ptr<Bpe>(
        new Bpe(std::move(spec.special_added), std::move(spec.normal_added), spec.normalizer));
    bpe->name_ = std::move(spec.name);
    int32_t max_id = -1;
    for (const auto& [bytes, id] : spec.vocab) max_id = std::max(max_id, id);
    for (const auto& [content, id] : bpe->added_ids_) max_id = std::max(max_id, id);
    if (max_id < 0) return absl::InvalidArgumentError("the vocabulary is empty");
    // The tables are indexed by id: a stray huge id would size them (INT32_MAX aborted).
    if (max_id >= kMaxTokenIds) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", max_id, " is too large: dtrain reads vocabularies whose ids are below ",
          kMaxTokenIds, " (the largest models' have about 260,000); check the file's ids"));
    }
    bpe->id_bytes_.resize(max_id + 1);
    bpe->known_.resize(max_id + 1);
    for (auto& [bytes, id] : spec.vocab) {
      if (id < 0) return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is negative"));
      bpe->id_bytes_[id] = bytes;
      bpe->known_[id] = true;
      bpe->token_ids_.emplace(std::move(bytes), id);
    }
    // An added token decodes to its text even where the model's vocabulary has other bytes.
    for (const auto& [content, id] : bpe->added_ids_) {
      bpe->id_bytes_[id] = content;
      bpe->known_[id] = true;
    }
    bpe->byte_level_ = spec.byte_level;
    bpe->normalizer_ = std::move(spec.normalizer);
    if (!spec.byte_level) RETURN_IF_ERROR(bpe->SetCharacterAlphabet(spec));
    for (int b = 0; b < 256 && spec.byte_level; ++b) {
      const auto it = bpe->token_ids_.find(std::string(1, static_cast<char>(b)));
      if (it == bpe->token_ids_.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "byte 0x%02x has no token, so not every text can be encoded; a byte-level "
            "vocabulary has all 256",
            b));
      }
      bpe->byte_ids_[b] = it->second;
    }
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const auto& [left, right] = spec.merges[rank];
      const auto left_id = bpe->token_ids_.find(left);
      const auto right_id = bpe->token_ids_.find(right);
      const auto merged_id = bpe->token_ids_.find(left + right);
      if (left_id == bpe->token_ids_.end() || right_id == bpe->token_ids_.end() ||
          merged_id == bpe->token_ids_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "merge ", rank, " ('", absl::CHexEscape(left), "' + '", absl::CHexEscape(right),
            "') joins or makes a token that is not in the vocabulary"));
      }
      // The first rank of a pair wins, as in Hugging Face's map built from the list.
      bpe->merges_.try_emplace(PairKey(left_id->second, right_id->second),
                               Merge{static_cast<int32_t>(rank), merged_id->second});
    }
    bpe->cuttable_ = !spec.add_prefix_space;
    for (const std::string& pattern : spec.split_patterns) {
      ASSIGN_OR_RETURN(std::unique_ptr<RegexSplitter> splitter, RegexSplitter::Compile(pattern));
      bpe->splitters_.push_back(std::move(splitter));
      bpe->cuttable_ =
          bpe->cuttable_ && (pattern == kGpt2SplitPattern || pattern == kLlama3SplitPattern);
    }
    bpe->cuttable_ = bpe->cuttable_ && !bpe->splitters_.empty();
    bpe->add_prefix_space_ = spec.add_prefix_space;
    bpe->ignore_merges_ = spec.ignore_merges;
    if (threads > 1 && spec.byte_level) bpe->pool_ = std::make_unique<ThreadPool>(threads);
    return std::unique_ptr<Tokenizer>(std::move(bpe));
  }

 private:
  // The normalized added tokens are found in normalized text by their normalized contents, as
  // Hugging Face finds them (under Llama 2's Prepend, "<tool>" is "▁<tool>": it matches only
  // after a space, which it takes); they decode to their contents as written.
  Bpe(std::vector<AddedToken> special, std::vector<AddedToken> normal, const Normalizer& normalizer)
      : special_(special), normal_(WithNormalizedContents(normal, normalizer)) {
    for (const std::vector<AddedToken>* tokens : {&special, &normal}) {
      for (const AddedToken& token : *tokens) added_ids_.emplace(token.content, token.id);
    }
  }

  absl::Status SetCharacterAlphabet(BpeSpec& spec) {
    byte_fallback_ = spec.byte_fallback;
    // Hugging Face falls back to bytes only where each byte of a character has a token.
    byte_ids_.fill(-1);
    for (const auto& [token, id] : token_ids_) {
      if (const int byte = ByteFallbackByte(token); byte >= 0) byte_ids_[byte] = id;
    }
    if (!spec.unk_token.empty()) {
      const auto it = token_ids_.find(spec.unk_token);
      if (it == token_ids_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.unk_token '", absl::CHexEscape(spec.unk_token), "' is not in the vocabulary"));
      }
      unk_id_ = it->second;
    }
    fuse_unk_ = spec.fuse_unk;
    metaspace_ = std::move(spec.metaspace);
    decoder_ = std::move(spec.decoder);
    return absl::OkStatus();
  }

  // Text without added tokens (normalized): in parallel where it is large and may be cut.
  absl::Status EncodePlain(std::string_view text, bool at_text_start,
                           std::vector<int32_t>* ids) const {
    if (!byte_level_) {
      // One thread: a stretch's start changes its first word (a Prepend normalizer, Metaspace's
      // prepend schemes) and without a Metaspace split (Llama 2's files) the whole stretch is
      // one word that merges may cross anywhere, so no cut provably keeps the ids.
      PieceCache& cache = ThreadCache();
      if (!metaspace_) return EncodePiece(text, cache, ids);
      absl::Status status;
      MetaspaceWords(*metaspace_, text, at_text_start, [&](std::string_view word) {
        if (status.ok()) status = EncodePiece(word, cache, ids);
      });
      return status;
    }
    if (pool_ == nullptr || !cuttable_ || text.size() < 2 * kParallelChunkBytes) {
      return EncodeChunk(text, ids);
    }
    // One parallel encode at a time; a concurrent caller encodes on its own thread.
    std::unique_lock<std::mutex> lock(pool_mu_, std::try_to_lock);
    if (!lock.owns_lock()) return EncodeChunk(text, ids);
    const std::vector<size_t> bounds = SafeCuts(text);
    const size_t chunks = bounds.size() - 1;
    if (chunks < 2) return EncodeChunk(text, ids);
    std::vector<std::vector<int32_t>> chunk_ids(chunks);
    std::vector<absl::Status> statuses(chunks);
    pool_->ParallelFor(chunks, 1, [&](size_t begin, size_t end, int) {
      for (size_t c = begin; c < end; ++c) {
        statuses[c] = EncodeChunk(text.substr(bounds[c], bounds[c + 1] - bounds[c]), &chunk_ids[c]);
      }
    });
    for (size_t c = 0; c < chunks; ++c) {
      RETURN_IF_ERROR(statuses[c]);
      ids->insert(ids->end(), chunk_ids[c].begin(), chunk_ids[c].end());
    }
    return absl::OkStatus();
  }

  // Chunk bounds [0, ..., text.size()]. A cut goes before an ASCII letter that starts a line
  // whose newline follows an ASCII character that is not whitespace. With GPT-2's and Llama 3's
  // patterns no piece holds a newline and then a letter, and that lone newline (or Llama 3's
  // punctuation-and-newlines piece) ends the same way whether a letter or the end of the text
  // follows it, so the pieces, and the ids, are those of the whole text.
  std::vector<size_t> SafeCuts(std::string_view text) const {
    const size_t target = std::max(kParallelChunkBytes, text.size() / (4 * pool_->size()) + 1);
    std::vector<size_t> bounds = {0};
    size_t pos = target;
    while (pos < text.size()) {
      const size_t newline = text.find('\n', pos);
      if (newline == std::string_view::npos || newline + 1 >= text.size()) break;
      const auto before = static_cast<unsigned char>(text[newline - 1]);
      if (before < 0x80 && !IsAsciiSpace(before) &&
          IsAsciiLetter(static_cast<unsigned char>(text[newline + 1]))) {
        bounds.push_back(newline + 1);
        pos = newline + 1 + target;
      } else {
        pos = newline + 1;
      }
    }
    bounds.push_back(text.size());
    return bounds;
  }

  absl::Status EncodeChunk(std::string_view text, std::vector<int32_t>* ids) const {
    std::string prefixed;
    if (add_prefix_space_ && text.front() != ' ') {
      prefixed = absl::StrCat(" ", View(text));
      text = prefixed;
    }
    return SplitAndEncode(0, text, ThreadCache(), ids);
  }

  PieceCache& ThreadCache() const {
    thread_local PieceCache cache;
    if (cache.owner != serial_) {
      cache.ids.clear();
      cache.owner = serial_;
    }
    return cache;
  }

  absl::Status SplitAndEncode(size_t stage, std::string_view text, PieceCache& cache,
                              std::vector<int32_t>* ids) const {
    if (stage == splitters_.size()) return EncodePiece(text, cache, ids);
    absl::Status status;
    RETURN_IF_ERROR(splitters_[stage]->Split(text, [&](std::string_view piece) {
      if (status.ok()) status = SplitAndEncode(stage + 1, piece, cache, ids);
    }));
    return status;
  }

  absl::Status EncodePiece(std::string_view piece, PieceCache& cache,
                           std::vector<int32_t>* ids) const {
    if (byte_level_ && piece.size() == 1) {
      ids->push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
      return absl::OkStatus();
    }
    if (ignore_merges_) {
      const auto it = token_ids_.find(View(piece));
      if (it != token_ids_.end()) {
        ids->push_back(it->second);
        return absl::OkStatus();
      }
    }
    const bool cached = piece.size() <= kCachedPieceBytes;
    if (cached) {
      const auto it = cache.ids.find(View(piece));
      if (it != cache.ids.end()) {
        ids->insert(ids->end(), it->second.begin(), it->second.end());
        return absl::OkStatus();
      }
    }
    thread_local std::vector<int32_t> symbols;
    symbols.clear();
    if (byte_level_) {
      for (const char c : piece) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    } else {
      RETURN_IF_ERROR(CharacterSymbols(piece, &symbols));
    }
    const size_t first = ids->size();
    MergeSymbols(symbols, ids);
    if (cached) {
      if (cache.ids.size() >= kCacheEntries) cache.ids.clear();
      cache.ids.emplace(std::string(piece), std::vector<int32_t>(ids->begin() + first, ids->end()));
    }
    return absl::OkStatus();
  }

  // Hugging Face's BPE::merge_word: each character's token, else its bytes' <0xNN> tokens
  // (byte_fallback, where all exist), else the unknown token (consecutive ones fused with
  // fuse_unk). A byte that is not UTF-8 is a character without a token.
  absl::Status CharacterSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
    int32_t pending_unk = -1;  // an unknown token not yet added: it may fuse with the next
    for (size_t i = 0; i < word.size();) {
      const size_t length = std::max<size_t>(1, Utf8SequenceLength(View(word), i));
      const std::string_view character = word.substr(i, length);
      i += length;
      if (const auto it = token_ids_.find(View(character)); it != token_ids_.end()) {
        if (pending_unk >= 0) symbols->push_back(pending_unk);
        pending_unk = -1;
        symbols->push_back(it->second);
        continue;
      }
      if (byte_fallback_ && std::all_of(character.begin(), character.end(), [&](char c) {
            return byte_ids_[static_cast<unsigned char>(c)] >= 0;
          })) {
        // Before a pending unknown token, as Hugging Face adds them.
        for (const char c : character) symbols->push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
      if (unk_id_ < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", absl::CHexEscape(View(character)), "' has no token in tokenizer ", name_,
            ", which has neither byte fallback nor an unk_token to write it with; Hugging Face "
            "would drop it silently"));
      }
      if (pending_unk >= 0 && !fuse_unk_) symbols->push_back(pending_unk);
      pending_unk = unk_id_;
    }
    if (pending_unk >= 0) symbols->push_back(pending_unk);
    return absl::OkStatus();
  }

  // Hugging Face's Word::merge_all: a heap of candidate merges ordered by (rank, position);
  // a candidate whose pair has changed since it was pushed is skipped. O(n log n) in the
  // piece's symbols, so a megabyte-long word is fine.
  void MergeSymbols(const std::vector<int32_t>& initial, std::vector<int32_t>* ids) const {
    struct Symbol {
      int32_t id;
      int32_t prev;
      int32_t next;  // -1 at either end
    };
    struct Candidate {
      int32_t rank;
      int32_t pos;
      int32_t id;
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : pos > other.pos;
      }
    };
    const int32_t n = static_cast<int32_t>(initial.size());
    if (n == 0) return;
    std::vector<Symbol> symbols(n);
    for (int32_t i = 0; i < n; ++i) symbols[i] = {initial[i], i - 1, i + 1 < n ? i + 1 : -1};
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    const auto push = [&](int32_t pos) {
      const auto it = merges_.find(PairKey(symbols[pos].id, symbols[symbols[pos].next].id));
      if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.id});
    };
    for (int32_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      Symbol& left = symbols[top.pos];
      if (left.id < 0 || left.next < 0) continue;
      const auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
      if (it == merges_.end() || it->second.id != top.id) continue;
      Symbol& right = symbols[left.next];
      left.id = top.id;
      right.id = -1;
      left.next = right.next;
      if (left.next >= 0) symbols[left.next].prev = top.pos;
      if (left.prev >= 0) push(left.prev);
      if (left.next >= 0) push(top.pos);
    }
    for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
  }

  std::string name_;
  const uint64_t serial_ = next_tokenizer_serial.fetch_add(1);
  bool byte_level_ = true;
  // Byte-level: each byte's token. Character alphabet: each <0xNN> token, -1 where none.
  std::array<int32_t, 256> byte_ids_{};
  absl::flat_hash_map<std::string, int32_t> token_ids_;  // raw bytes -> id
  absl::flat_hash_map<uint64_t, Merge> merges_;          // (left, right) -> rank, result
  std::vector<std::string> id_bytes_;                    // id -> raw bytes, for Decode
  std::vector<bool> known_;                              // ids that hold a token
  std::vector<std::unique_ptr<RegexSplitter>> splitters_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  bool cuttable_ = false;  // SafeCuts holds for every split pattern
  AddedTokenMatcher special_;
  AddedTokenMatcher normal_;
  absl::flat_hash_map<std::string, int32_t> added_ids_;
  // The character alphabet's stages (bpe.h).
  Normalizer normalizer_;
  std::optional<MetaspaceSpec> metaspace_;
  bool byte_fallback_ = false;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  std::vector<DecoderStep> decoder_;  // byte-level: none, the bytes are the text
  std::unique_ptr<ThreadPool> pool_;  // null: one thread
  mutable std::mutex pool_mu_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeBpe(BpeSpec spec, int threads) {
  return Bpe::Make(std::move(spec), threads);
}

std::string ByteLevelCharacter(unsigned char byte) {
  static const std::array<char32_t, 256> kCodepointOf = ByteToCodepoint();
  const char32_t codepoint = kCodepointOf[byte];
  // The alphabet ends at U+0143: one or two bytes of UTF-8.
  if (codepoint < 0x80) return std::string(1, static_cast<char>(codepoint));
  return {static_cast<char>(0xC0 | (codepoint >> 6)), static_cast<char>(0x80 | (codepoint & 0x3F))};
}

bool ByteLevelToBytes(std::string_view token, std::string* bytes) {
  static const std::array<int16_t, 512> kByteOf = [] {
    std::array<int16_t, 512> inverse;
    inverse.fill(-1);
    const std::array<char32_t, 256> forward = ByteToCodepoint();
    for (int b = 0; b < 256; ++b) inverse[forward[b]] = static_cast<int16_t>(b);
    return inverse;
  }();
  bytes->clear();
  for (size_t i = 0; i < token.size();) {
    const auto lead = static_cast<unsigned char>(token[i]);
    char32_t codepoint;
    if (lead < 0x80) {
      codepoint = lead;
      i += 1;
    } else if ((lead & 0xE0) == 0xC0 && i + 1 < token.size()) {
      codepoint = ((lead & 0x1F) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;  // the alphabet ends at U+0143: two bytes at most
    }
    if (codepoint >= kByteOf.size() || kByteOf[codepoint] < 0) return false;
    bytes->push_back(static_cast<char>(kByteOf[codepoint]));
  }
  return true;
}

}  // namespace dtrain
