// One easy handle driven by a multi handle, so Read() pulls data at the reader's pace instead of
// libcurl pushing the whole body into memory.
#include "core/data/http_source.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/util/exit_codes.h"
#include "core/util/log.h"
#include "core/util/status.h"

namespace dtrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxBackoffMs = 30000;
// Bytes an attempt must bring for its failure to start the retry count again.
constexpr int64_t kProgressBytes = int64_t{1} << 20;

bool RetryableHttpStatus(long status) { return status == 408 || status == 429 || status >= 500; }

// The first byte that a Content-Range header ("bytes 100-199/1000") names; -1 if it names none.
int64_t ContentRangeStart(absl::string_view header) {
  if (!absl::StartsWithIgnoreCase(header, "bytes ")) return -1;
  header.remove_prefix(6);
  int64_t start = -1;
  const size_t dash = header.find('-');
  if (dash == absl::string_view::npos || !absl::SimpleAtoi(header.substr(0, dash), &start)) {
    return -1;
  }
  return start;
}

class HttpSource final : public ByteSource {
 public:
  HttpSource(std::string url, const ShardSourceOptions& options)
      : url_(std::move(url)), options_(options), multi_(curl_multi_init()) {}

  ~HttpSource() override {
    StopTransfer();
    curl_multi_cleanup(multi_);
  }

  absl::StatusOr<size_t> Read(char* out, size_t n) override {
    while (true) {
      if (head_ < buffer_.size()) {
        const size_t count = std::min(n, buffer_.size() - head_);
        std::copy_n(buffer_.data() + head_, count, out);
        head_ += count;
        if (head_ == buffer_.size()) buffer_.clear(), head_ = 0;
        return count;
      }
      if (finished_) return size_t{0};
      if (easy_ == nullptr) StartTransfer();
      if (paused_) {
        paused_ = false;
        last_data_ = Clock::now();  // the pause was the reader's time, not the server's
        curl_easy_pause(easy_, CURLPAUSE_CONT);  // may deliver the held chunk right away
        continue;
      }
      absl::Status failure = Drive();
      if (failure.ok()) continue;
      ++attempts_;
      // An attempt that brought a good part of the shard ends a run of failures: the retries are
      // per stall, so a long shard over a link that drops now and then still arrives, while a
      // server that sends a trickle before each stall still runs out of them.
      if (received_ - attempt_start_ >= kProgressBytes) retries_in_a_row_ = 0;
      if (failure.code() != absl::StatusCode::kUnavailable ||
          retries_in_a_row_ >= options_.http_retries) {
        StopTransfer();
        if (failure.code() != absl::StatusCode::kUnavailable) return failure;
        return absl::UnavailableError(absl::StrCat(
            url_, ": failed after ", attempts_, attempts_ == 1 ? " attempt, " : " attempts, ",
            received_, " bytes received (last: ", failure.message(),
            "); check the server, or raise data.http_retries / data.http_timeout_s"));
      }
      const int backoff_ms = std::min(
          kMaxBackoffMs, options_.http_retry_backoff_ms << std::min(retries_in_a_row_, 16));
      ++retries_in_a_row_;
      LogWarn("%s: %s; retry %d of %d in %d ms, resuming at byte %d", url_, failure.message(),
              retries_in_a_row_, options_.http_retries, backoff_ms, received_);
      StopTransfer();
      const Clock::time_point retry_at = Clock::now() + std::chrono::milliseconds(backoff_ms);
      while (Clock::now() < retry_at) {
        RETURN_IF_ERROR(CheckNotStopped(options_, url_));
        std::this_thread::sleep_for(std::min<Clock::duration>(
            std::chrono::milliseconds(kStopCheckMs), retry_at - Clock::now()));
      }
    }
  }

  absl::Status Close() override { return absl::OkStatus(); }
  const std::string& url() const override { return url_; }

 private:
  // The headers of a response that says which bytes it holds and which version of the shard.
  struct Response {
    long status = 0;
    std::string content_range, content_length, etag, last_modified;
    // The shard's whole size as the response gives it (a 206's Content-Range total, a 200's
    // Content-Length); -1 where it does not say.
    int64_t ShardBytes() const {
      int64_t bytes = -1;
      const size_t slash = content_range.rfind('/');
      const std::string& text =
          status == 206
              ? (slash == std::string::npos ? content_range : content_range.substr(slash + 1))
              : content_length;
      return absl::SimpleAtoi(text, &bytes) ? bytes : -1;
    }
  };

  static size_t OnData(char* data, size_t size, size_t count, void* self) {
    return static_cast<HttpSource*>(self)->Accept(data, size * count);
  }

  static size_t OnHeader(char* data, size_t size, size_t count, void* self) {
    static_cast<HttpSource*>(self)->Header(absl::string_view(data, size * count));
    return size * count;
  }

  void Header(absl::string_view line) {
    if (absl::StartsWithIgnoreCase(line, "HTTP/")) {  // each response of a redirect has its own
      response_ = {};
      return;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) return;
    const absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
    const std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (absl::EqualsIgnoreCase(name, "Content-Range")) response_.content_range = value;
    if (absl::EqualsIgnoreCase(name, "Content-Length")) response_.content_length = value;
    if (absl::EqualsIgnoreCase(name, "ETag")) response_.etag = value;
    if (absl::EqualsIgnoreCase(name, "Last-Modified")) response_.last_modified = value;
  }

  // Whether the response to a resumed attempt continues the bytes received: the same version of
  // the shard (its ETag and Last-Modified, where the first response gave them) and, for a 206,
  // the range asked for. Else a DataLoss error: the samples would mix two versions, or repeat.
  absl::Status CheckResumedResponse() const {
    const auto changed = [&](absl::string_view header, const std::string& was,
                             const std::string& is) {
      return absl::DataLossError(
          absl::StrCat(url_, ": the shard changed on the server after ", received_, " bytes (",
                       header, " '", was, "', now '", is,
                       "'): its bytes would mix two versions; read it again from the "
                       "start, or keep shards unchanged while a run reads them"));
    };
    // A weak ETag (W/"...") names the same version as its strong form.
    if (!first_.etag.empty() && !response_.etag.empty() &&
        absl::StripPrefix(response_.etag, "W/") != absl::StripPrefix(first_.etag, "W/")) {
      return changed("ETag", first_.etag, response_.etag);
    }
    if (const int64_t was = first_.ShardBytes(), is = response_.ShardBytes();
        was >= 0 && is >= 0 && was != is) {
      return changed("size", absl::StrCat(was), absl::StrCat(is));
    }
    if (!first_.last_modified.empty() && !response_.last_modified.empty() &&
        response_.last_modified != first_.last_modified) {
      return changed("Last-Modified", first_.last_modified, response_.last_modified);
    }
    if (status_ == 206 && ContentRangeStart(response_.content_range) != received_) {
      return absl::DataLossError(
          absl::StrCat(url_, ": asked for the bytes from ", received_,
                       " on after a broken transfer, the server answered 206 with Content-Range '",
                       response_.content_range, "': its bytes would not continue the shard"));
    }
    return absl::OkStatus();
  }

  size_t Accept(const char* data, size_t bytes) {
    if (status_ == 0) {
      curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &status_);
      response_.status = status_;
      if (received_ == 0) first_ = response_;
      if (status_ < 400 && received_ > 0) {
        refused_ = CheckResumedResponse();
        if (!refused_.ok()) return 0;  // abort; Finished() reports it
      }
      // A server that ignores Range sends the whole body again: drop what we already have.
      skip_ = (received_ > 0 && status_ == 200) ? received_ : 0;
    }
    if (status_ >= 400) return 0;  // not the body: abort, Drive() reports the status
    if (buffer_.size() - head_ >= options_.http_buffer_bytes) {
      paused_ = true;
      return CURL_WRITEFUNC_PAUSE;  // libcurl keeps this chunk and delivers it on unpause
    }
    const size_t dropped = static_cast<size_t>(std::min<int64_t>(skip_, bytes));
    skip_ -= static_cast<int64_t>(dropped);
    buffer_.append(data + dropped, bytes - dropped);
    received_ += static_cast<int64_t>(bytes - dropped);
    last_data_ = Clock::now();
    return bytes;
  }

  void StartTransfer() {
    static std::once_flag curl_initialized;
    std::call_once(curl_initialized, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    easy_ = curl_easy_init();
    curl_easy_setopt(easy_, CURLOPT_URL, url_.c_str());
    curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &HttpSource::OnData);
    curl_easy_setopt(easy_, CURLOPT_WRITEDATA, this);
    curl_easy_setopt(easy_, CURLOPT_HEADERFUNCTION, &HttpSource::OnHeader);
    curl_easy_setopt(easy_, CURLOPT_HEADERDATA, this);
    curl_easy_setopt(easy_, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(easy_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy_, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options_.http_timeout_s * 1000));
    curl_easy_setopt(easy_, CURLOPT_BUFFERSIZE, 256L * 1024);
    curl_easy_setopt(easy_, CURLOPT_ERRORBUFFER, error_);
    if (received_ > 0) {
      const std::string range = absl::StrCat(received_, "-");
      curl_easy_setopt(easy_, CURLOPT_RANGE, range.c_str());  // libcurl copies the string
    }
    error_[0] = '\0';
    status_ = 0;
    paused_ = false;
    last_data_ = Clock::now();
    attempt_start_ = received_;
    curl_multi_add_handle(multi_, easy_);
  }

  void StopTransfer() {
    if (easy_ == nullptr) return;
    curl_multi_remove_handle(multi_, easy_);
    curl_easy_cleanup(easy_);
    easy_ = nullptr;
  }

  // Runs the transfer until data arrives or it ends. OK: data, end or pause; Unavailable: a
  // failure worth retrying; other codes: final.
  absl::Status Drive() {
    int running = 0;
    curl_multi_perform(multi_, &running);
    int queued = 0;
    while (CURLMsg* message = curl_multi_info_read(multi_, &queued)) {
      if (message->msg == CURLMSG_DONE) return Finished(message->data.result);
    }
    if (head_ < buffer_.size() || paused_) return absl::OkStatus();
    const double idle_s = std::chrono::duration<double>(Clock::now() - last_data_).count();
    if (idle_s > options_.http_timeout_s) {
      return absl::UnavailableError(
          absl::StrCat("no data for ", options_.http_timeout_s, " s (data.http_timeout_s)"));
    }
    RETURN_IF_ERROR(CheckNotStopped(options_, url_));
    curl_multi_poll(multi_, nullptr, 0, kStopCheckMs, nullptr);
    return absl::OkStatus();
  }

  absl::Status Finished(CURLcode result) {
    if (!refused_.ok()) return refused_;
    if (status_ == 0) curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &status_);
    if (status_ >= 400) {
      const std::string what = absl::StrCat("HTTP status ", status_);
      if (RetryableHttpStatus(status_)) return absl::UnavailableError(what);
      return absl::NotFoundError(absl::StrCat(url_, ": ", what,
                                              "; check data.shards and that "
                                              "the server holds this shard"));
    }
    if (result != CURLE_OK) {
      // libcurl's detail often ends with its summary already ("... after 0 ms: Couldn't connect
      // to server"): said once.
      const absl::string_view summary = curl_easy_strerror(result), detail = error_;
      const std::string what = detail.empty() ? std::string(summary)
                               : absl::StrContains(detail, summary)
                                   ? std::string(detail)
                                   : absl::StrCat(summary, ": ", detail);
      // No retry mends the URL itself.
      if (result == CURLE_URL_MALFORMAT || result == CURLE_UNSUPPORTED_PROTOCOL) {
        return WithExitCode(
            absl::InvalidArgumentError(absl::StrCat(
                url_, ": ", what, "; check data.shards",
                result == CURLE_URL_MALFORMAT
                    ? " (write a space or other character URLs do not allow percent-encoded, e.g. "
                      "%20)"
                    : " (this libcurl does not speak that protocol: use http:// or https://)")),
            kExitUsage);
      }
      return absl::UnavailableError(what);
    }
    finished_ = true;
    StopTransfer();
    return absl::OkStatus();
  }

  std::string url_;
  ShardSourceOptions options_;
  CURLM* multi_;
  CURL* easy_ = nullptr;
  char error_[CURL_ERROR_SIZE] = {};
  std::string buffer_;  // received, not yet read: [head_, size())
  size_t head_ = 0;
  int64_t received_ = 0;  // body bytes received over all attempts
  int64_t skip_ = 0;      // bytes of a restarted (200) body that we already have
  long status_ = 0;       // HTTP status of the current attempt; 0 until known
  Response response_;     // the current attempt's headers
  Response first_;        // the headers of the attempt that brought the first bytes
  absl::Status refused_;  // a resumed attempt's response that does not continue the shard
  bool paused_ = false;
  bool finished_ = false;
  int64_t attempt_start_ = 0;  // received_ when the current attempt began
  int attempts_ = 0;           // failed attempts in all
  int retries_in_a_row_ = 0;   // retries since an attempt last received data
  Clock::time_point last_data_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ByteSource>> OpenHttp(const std::string& url,
                                                     const ShardSourceOptions& options) {
  return std::unique_ptr<ByteSource>(new HttpSource(url, options));
}

}  // namespace dtrain
