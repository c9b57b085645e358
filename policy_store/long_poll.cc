#include "policy_store/long_poll.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "policy_store/http_store.h"

namespace weft::policy_store {
namespace {

namespace http = boost::beast::http;
using weft::http::RequestHeader;
using weft::http::Response;

// How long one watch of the backend lasts before it is renewed (shorter than the longest wait a
// remote backend grants, so that the watch goes on across renewals).
constexpr std::chrono::milliseconds kWatchRound(10000);
// After a backend error, the next try waits this long.
constexpr std::chrono::milliseconds kRetryAfterError(1000);

std::string_view Trimmed(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

}  // namespace

Result<std::optional<std::chrono::seconds>> PreferredWait(const RequestHeader& request,
                                                          std::chrono::seconds longest) {
  std::optional<std::chrono::seconds> wait;
  for (const auto& field : request) {
    if (field.name() != http::field::prefer) continue;
    std::string_view rest(field.value().data(), field.value().size());
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      // A preference's parameters (after ';') are not wait's business.
      std::string_view item = Trimmed(rest.substr(0, std::min(comma, rest.find(';'))));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (item.rfind("wait", 0) != 0 || Trimmed(item.substr(4)).rfind('=', 0) != 0) continue;
      std::string_view number = Trimmed(Trimmed(item.substr(4)).substr(1));
      if (number.size() >= 2 && number.front() == '"' && number.back() == '"')
        number = number.substr(1, number.size() - 2);
      if (number.empty() || number.size() > 9 ||
          !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return InvalidArgument("Prefer: wait=" + std::string(number) +
                               ": the wait is a whole number of seconds");
      }
      wait = std::min(longest, std::chrono::seconds(std::stoll(std::string(number))));
    }
  }
  return wait;
}

LongPolls::LongPolls(ObjectStore& backend, std::chrono::milliseconds poll_interval)
    : backend_(backend), poll_interval_(poll_interval), expiry_([this] { Expire(); }) {}

LongPolls::~LongPolls() { Stop(); }

size_t LongPolls::waiting() const {
  MutexLock lock(mutex_);
  size_t count = 0;
  for (const auto& [key, state] : keys_) count += state.polls.size();
  return count;
}

bool LongPolls::Differs(const Key& state, const Poll& poll) {
  if (!state.value) return poll.etag.has_value();  // gone (or still absent: no change)
  return !poll.etag || *poll.etag != state.etag;
}

Response LongPolls::AnswerOf(const Key& state, const std::string& key, const Poll& poll,
                             bool expired) {
  Response answer;
  if (expired && !state.error.ok()) {
    answer = weft::http::ErrorResponse(poll.request, state.error);
  } else if (!state.value) {
    answer =
        weft::http::ErrorResponse(poll.request, http::status::not_found, "no such object: " + key);
  } else {
    answer =
        Response(expired ? http::status::not_modified : http::status::ok, poll.request.version());
    answer.set(http::field::etag, state.etag);
    answer.set(http::field::cache_control, "no-cache");
    if (!expired) {
      answer.set(http::field::content_type, "application/octet-stream");
      answer.body().assign(state.value->begin(), state.value->end());
    }
    answer.prepare_payload();
  }
  answer.set(http::field::preference_applied, "wait=" + std::to_string(poll.wait.count()));
  return answer;
}

void LongPolls::Give(std::vector<Answer>& answers) {
  for (Answer& answer : answers) answer.respond(std::move(answer.response));
  answers.clear();
}

bool LongPolls::Add(const RequestHeader& request, const std::string& key, std::chrono::seconds wait,
                    const weft::http::Responder& respond) {
  Poll poll{request, std::nullopt, wait, Clock::now() + wait, respond};
  if (request.count(http::field::if_none_match) > 0)
    poll.etag = std::string(request[http::field::if_none_match]);
  std::vector<Answer> answers;
  {
    MutexLock lock(mutex_);
    if (stopped_) {
      answers.push_back({std::move(poll.respond),
                         weft::http::ErrorResponse(request, http::status::service_unavailable,
                                                   "the server is stopping")});
    } else {
      auto found = keys_.find(key);
      // A key not watched yet needs a thread: past the limit, the request is served as a plain GET.
      if (found == keys_.end() && keys_.size() >= kMaxWatchedKeys) return false;
      Key& state = found != keys_.end() ? found->second : keys_[key];
      if (state.known && state.error.ok() && Differs(state, poll)) {
        answers.push_back({poll.respond, AnswerOf(state, key, poll, false)});
      } else {
        const bool watched = found != keys_.end();
        state.polls.push_back(std::move(poll));
        if (!watched) {
          ++watchers_;
          std::thread([this, key] { Watch(key); }).detach();
        }
        changed_.notify_all();  // (the expiry's earliest deadline may be this one)
      }
    }
  }
  Give(answers);
  return true;
}

void LongPolls::Watch(std::string key) {
  std::optional<std::string> value;
  bool have = false;  // `value` has been read
  while (!stopping_.load()) {
    // The first call reads the key (a wait of nothing: whatever it holds differs from nothing we
    // know), the next ones wait for it to change from what was read.
    Result<ObjectWatch> got = backend_.WaitForChange(
        key, value, have ? kWatchRound : std::chrono::milliseconds(0), &stopping_);
    backend_calls_.fetch_add(1);
    std::vector<Answer> answers;
    bool done = false;
    {
      MutexLock lock(mutex_);
      Key& state = keys_[key];
      if (got.ok()) {
        value = got->value;
        have = true;
        state.value = value;
        state.etag = value ? ObjectEtag(*value) : std::string();
        state.error = Status::Ok();
        state.known = true;
        std::vector<Poll> still;
        for (Poll& poll : state.polls) {
          if (Differs(state, poll)) {
            answers.push_back({poll.respond, AnswerOf(state, key, poll, false)});
          } else {
            still.push_back(std::move(poll));
          }
        }
        state.polls = std::move(still);
      } else if (!stopping_.load()) {
        state.error = got.status();
        state.known = true;  // (polls whose wait ends are answered with the error)
        WEFT_LOG(kWarning) << "watching " << key << ": " << got.status().message();
      }
      if (state.polls.empty() || stopping_.load()) {
        // Forgotten, polls and all (Stop answers them first).
        keys_.erase(key);
        done = true;
      }
      changed_.notify_all();
    }
    Give(answers);
    if (done) break;
    // A backend that cannot push is read again after the poll interval, once for every poll; after
    // an error, a while later.
    std::chrono::milliseconds pause(0);
    if (!got.ok()) {
      pause = kRetryAfterError;
    } else if (!got->waited) {
      pause = poll_interval_;
    }
    if (pause.count() > 0) {
      MutexLock lock(mutex_);
      changed_.wait_for(lock.native(), pause, [&]() REQUIRES(mutex_) { return stopped_; });
    }
  }
  MutexLock lock(mutex_);
  if (--watchers_ == 0) changed_.notify_all();
}

void LongPolls::Expire() {
  MutexLock lock(mutex_);
  while (!stopped_) {
    std::vector<Answer> answers;
    Clock::time_point next = Clock::now() + std::chrono::seconds(60);
    const Clock::time_point now = Clock::now();
    for (auto& [key, state] : keys_) {
      if (!state.known) continue;  // not read since its watch started: no answer yet
      std::vector<Poll> still;
      for (Poll& poll : state.polls) {
        if (poll.deadline <= now) {
          answers.push_back({poll.respond, AnswerOf(state, key, poll, true)});
        } else {
          next = std::min(next, poll.deadline);
          still.push_back(std::move(poll));
        }
      }
      state.polls = std::move(still);
    }
    if (!answers.empty()) {
      lock.Unlock();
      Give(answers);
      lock.Lock();
      continue;
    }
    changed_.wait_until(lock.native(), next);
  }
}

void LongPolls::Stop() {
  std::vector<Answer> answers;
  {
    MutexLock lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    stopping_.store(true);
    for (auto& [key, state] : keys_) {
      for (Poll& poll : state.polls) {
        answers.push_back({poll.respond, weft::http::ErrorResponse(
                                             poll.request, http::status::service_unavailable,
                                             "the server is stopping")});
      }
      state.polls.clear();
    }
    changed_.notify_all();
  }
  Give(answers);
  expiry_.join();
  MutexLock lock(mutex_);
  changed_.wait(lock.native(), [&]() REQUIRES(mutex_) { return watchers_ == 0; });
}

}  // namespace weft::policy_store
