#include "core/data/data_inspect.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/data/sample_grouper.h"
#include "core/data/shard_urls.h"
#include "core/data/tar_reader.h"
#include "core/data/token_decode.h"
#include "core/util/status.h"

namespace dtrain {

absl::Status InspectShards(const std::string& pattern, const InspectOptions& options,
                           std::ostream& out) {
  ASSIGN_OR_RETURN(const std::vector<std::string> urls, ExpandShardUrls(pattern));
  // Ids past the decoding tokenizer's vocabulary are refused as training refuses ids past
  // model.vocab_size; without a tokenizer, any id is.
  const int vocab_size = options.tokenizer != nullptr ? options.tokenizer->vocab_size()
                                                      : std::numeric_limits<int32_t>::max();
  const auto start = std::chrono::steady_clock::now();
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t bytes = 0;
  int64_t refused = 0;  // samples whose tokens training refuses
  absl::Status first_refusal;
  TokenDocument document;  // ids as training reads them: validated, not widened
  std::vector<int32_t> ids;
  Sample sample;
  // One shard's samples, listed and counted; the error that ends its archive early.
  const auto inspect_shard = [&](const std::string& url) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, OpenShard(url, options.source));
    TarReader reader(source.get());
    SampleGrouper grouper(&reader);
    while (true) {
      absl::StatusOr<bool> more = grouper.Next(&sample);
      if (!more.ok()) {
        bytes += reader.offset();
        return WithSourceCause(*source, more.status());
      }
      if (!*more) break;
      const bool listed =
          !options.summary_only && (options.max_samples < 0 || samples < options.max_samples);
      std::string fields;  // before TakeSampleTokens takes the token field's bytes
      if (listed) {
        for (const SampleField& field : sample.fields) {
          absl::StrAppend(&fields, " .", field.extension, "(", field.data.size(), " B)");
        }
      }
      const absl::Status decoded =
          TakeSampleTokens(&sample, vocab_size, &document, {}, options.tokenizer);
      if (!decoded.ok() && refused++ == 0) first_refusal = decoded;
      const int64_t sample_tokens = decoded.ok() ? document.size() : 0;
      tokens += sample_tokens;
      ++samples;
      if (!listed) continue;
      out << url << "  " << sample.key << ":" << fields << "  "
          << (decoded.ok() ? absl::StrCat(sample_tokens, " tokens")
                           : absl::StrCat("refused: ", decoded.message()))
          << "\n";
      if (options.tokenizer != nullptr && sample.Find(kTokenizerExtension) != nullptr) {
        const std::string name = RecordedTokenizerName(sample);
        if (!SameTokenizer(name, options.tokenizer->name())) {
          out << "  note: the shard records tokenizer " << name << ", not "
              << options.tokenizer->name() << "; the text below may be wrong\n";
        }
      }
      if (options.tokenizer != nullptr && decoded.ok()) {
        const int64_t shown = options.text_tokens < 0
                                  ? sample_tokens
                                  : std::min<int64_t>(sample_tokens, options.text_tokens);
        ids.resize(shown);
        document.CopyTo(0, shown, ids.data());
        absl::StatusOr<std::string> text = options.tokenizer->Decode(ids);
        if (!text.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(url, ", sample '", sample.key,
                                                         "': ", text.status().message(),
                                                         "; is it the shards' tokenizer?"));
        }
        // Invalid UTF-8 (a byte-level token cut inside a character) shows as U+FFFD.
        out << "  text: "
            << nlohmann::json(*text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        if (shown < sample_tokens) out << " ... (" << sample_tokens - shown << " more tokens)";
        out << "\n";
      }
    }
    bytes += reader.offset();
    return source->Close();
  };
  int64_t damaged = 0;  // shards that do not read to their end
  absl::Status first_damage;
  for (const std::string& url : urls) {
    const absl::Status read = inspect_shard(url);
    if (read.ok()) continue;
    out << url << "  does not read: " << read.message() << "\n";
    if (damaged++ == 0) first_damage = read;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out << absl::StrFormat("%d shards, %d samples, %d tokens, %d bytes in %.3f s: %.1f MB/s\n",
                         urls.size(), samples, tokens, bytes, seconds,
                         static_cast<double>(bytes) / 1e6 / std::max(seconds, 1e-9));
  if (damaged > 0) {
    return Renamed(first_damage,
                   absl::StrCat(damaged, " of ", urls.size(),
                                " shards do not read to their end, which fails the run "
                                "(data.on_error: skip_shard skips them); first: ",
                                first_damage.message(),
                                refused == 0 ? ""
                                             : absl::StrCat("; and ", refused,
                                                            " samples hold no tokens training "
                                                            "accepts")));
  }
  if (refused == 0) return absl::OkStatus();
  return Renamed(first_refusal,
                 absl::StrCat(refused, " of ", samples,
                              " samples hold no tokens training accepts, which fails the run "
                              "(data.on_error: skip_shard skips their shards); first: ",
                              first_refusal.message()));
}

}  // namespace dtrain
