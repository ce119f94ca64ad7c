#include "server/http_guard.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "server/openai.h"

namespace xpert::server {

namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_fd = -1;           // the connection a handler on this thread serves
thread_local bool t_overflow = false;  // set while the pool runs a connection inline: refuse it

int ms_left(Clock::time_point deadline) {
  const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return d < 0 ? 0 : (int)std::min<int64_t>(d, 1 << 30);
}

std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t')) ++a;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t')) --b;
  return s.substr(a, b - a);
}

const char* reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// Whole write with a deadline; false when the client does not take it.
bool write_all(int fd, const char* p, size_t n, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, ms_left(deadline)) <= 0 || (pfd.revents & (POLLERR | POLLHUP))) return false;
  }
  return true;
}

bool hung_up(int fd) {
  pollfd pfd{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&pfd, 1, 0) <= 0) return false;
  if (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  if (pfd.revents & (POLLRDHUP | POLLIN)) {
    char c;
    const ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

void peer_or_local(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if ((peer ? ::getpeername(fd, (sockaddr*)&ss, &len) : ::getsockname(fd, (sockaddr*)&ss, &len)) != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* a = (sockaddr_in*)&ss;
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = (sockaddr_in6*)&ss;
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// What httplib reads: the normalized request from memory; what it writes goes to the client.
class MemoryRequestStream final : public httplib::Stream {
 public:
  MemoryRequestStream(int fd, std::string data, int write_timeout_ms)
      : fd_(fd), data_(std::move(data)), write_timeout_ms_(write_timeout_ms) {}
  bool is_readable() const override { return pos_ < data_.size(); }
  bool is_writable() const override {
    if (hung_up(fd_)) return false;
    pollfd pfd{fd_, POLLOUT, 0};
    return ::poll(&pfd, 1, write_timeout_ms_) > 0 && !(pfd.revents & (POLLERR | POLLHUP));
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, data_.size() - pos_);
    std::memcpy(ptr, data_.data() + pos_, n);
    pos_ += n;
    return (ssize_t)n;
  }
  ssize_t write(const char* ptr, size_t size) override {
    return write_all(fd_, ptr, size, write_timeout_ms_) ? (ssize_t)size : -1;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { peer_or_local(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { peer_or_local(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  int fd_;
  std::string data_;
  size_t pos_ = 0;
  int write_timeout_ms_;
};

// Connection threads, started as connections come and ended after a minute idle: no thread sits waiting
// for a connection that may never come (`--queue 4096` used to start 4,105). Past max_threads a connection
// runs inline on the listener thread, where the guard only answers 503.
class ConnectionPool final : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t max_threads) : max_threads_(max_threads) {}
  ~ConnectionPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock lk(mu_);
    if (n_idle_ > jobs_.size()) {
      jobs_.push_back(std::move(fn));
      cv_.notify_one();
      return;
    }
    if (n_threads_ < max_threads_ && !shut_) {
      jobs_.push_back(std::move(fn));
      ++n_threads_;
      std::thread([this] { worker(); }).detach();
      return;
    }
    lk.unlock();
    t_overflow = true;
    fn();
    t_overflow = false;
  }

  void shutdown() override {
    std::unique_lock lk(mu_);
    shut_ = true;
    cv_.notify_all();
    done_.wait(lk, [&] { return n_threads_ == 0; });
  }

 private:
  void worker() {
    std::unique_lock lk(mu_);
    while (true) {
      if (jobs_.empty()) {
        ++n_idle_;
        const bool got = cv_.wait_for(lk, std::chrono::seconds(60), [&] { return !jobs_.empty() || shut_; });
        --n_idle_;
        if (jobs_.empty() && (shut_ || !got)) break;
        if (jobs_.empty()) continue;
      }
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      fn();
      lk.lock();
    }
    --n_threads_;
    done_.notify_all();
  }

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::deque<std::function<void()>> jobs_;
  size_t n_threads_ = 0, n_idle_ = 0;
  bool shut_ = false;
};

}  // namespace

int parse_request_head(const std::string& head, const HttpLimits& limits, RequestHead& out, std::string& why) {
  out = RequestHead{};
  size_t start = 0;
  bool first = true;
  while (start <= head.size()) {
    size_t end = head.find('\n', start);
    if (end == std::string::npos) end = head.size();
    std::string line = head.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    start = end + 1;
    if (first) {
      out.request_line = line;
      first = false;
      if (line.empty()) {
        why = "the request line is empty";
        return 400;
      }
      continue;
    }
    if (line.empty()) continue;
    if ((int)out.headers.size() >= limits.max_headers) {
      why = fmt::format("more than {} request headers", limits.max_headers);
      return 431;
    }
    const size_t colon = line.find(':');
    if (line[0] == ' ' || line[0] == '\t' || colon == std::string::npos || colon == 0 ||
        line.find_first_of(" \t") < colon) {
      why = "a header line is not 'Name: value'";
      return 400;
    }
    std::string name = line.substr(0, colon), value = trim(line.substr(colon + 1));
    const std::string key = lower(name);
    if (key == "content-length") {
      if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos) {
        why = fmt::format("Content-Length '{}' is not a non-negative integer", value.substr(0, 40));
        return 400;
      }
      const uint64_t n = std::stoull(value);
      if (out.has_length && n != out.content_length) {
        why = "two different Content-Length headers";
        return 400;
      }
      out.has_length = true;
      out.content_length = n;
    } else if (key == "transfer-encoding") {
      if (lower(value) != "chunked") {
        why = fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", value.substr(0, 40));
        return 501;
      }
      out.chunked = true;
    } else if (key == "content-encoding") {
      out.content_encoding = lower(value);
    } else if (key == "expect") {
      if (lower(value) != "100-continue") {
        why = fmt::format("Expect '{}' is not supported", value.substr(0, 40));
        return 417;
      }
      out.expect_continue = true;
    }
    out.headers.emplace_back(std::move(name), std::move(value));
  }
  if (out.chunked && out.has_length) {
    why = "both Content-Length and Transfer-Encoding: chunked";
    return 400;
  }
  const std::string& ce = out.content_encoding;
  if (!ce.empty() && ce != "identity" && ce != "gzip" && ce != "x-gzip" && ce != "deflate") {
    why = fmt::format("Content-Encoding '{}' is not supported (gzip, deflate or none)", ce.substr(0, 40));
    return 415;
  }
  return 0;
}

int decode_chunked(const std::string& in, size_t& pos, std::string& body, size_t max_body, std::string& why) {
  while (true) {
    const size_t eol = in.find('\n', pos);
    if (eol == std::string::npos) {
      if (in.size() - pos > 1024) {
        why = "a chunk-size line is longer than 1 KiB";
        return 400;
      }
      return 0;
    }
    std::string line = in.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const std::string size_text = trim(line.substr(0, line.find(';')));
    if (size_text.empty() || size_text.size() > 15 ||
        size_text.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      why = "a chunk size is not a hexadecimal number";
      return 400;
    }
    const uint64_t n = std::stoull(size_text, nullptr, 16);
    if (n == 0) {
      // Trailers up to an empty line (ignored).
      size_t p = eol + 1;
      while (true) {
        const size_t e = in.find('\n', p);
        if (e == std::string::npos) {
          if (in.size() - (eol + 1) > 8192) {
            why = "the chunked trailers are longer than 8 KiB";
            return 400;
          }
          return 0;
        }
        const size_t len = e - p - (e > p && in[e - 1] == '\r' ? 1 : 0);
        p = e + 1;
        if (len == 0) {
          pos = p;
          return 1;
        }
        if (p - (eol + 1) > 8192) {
          why = "the chunked trailers are longer than 8 KiB";
          return 400;
        }
      }
    }
    if (body.size() + n > max_body) {
      why = fmt::format("the decoded body is larger than the limit of {} bytes (--max-body)", max_body);
      return 413;
    }
    const size_t data = eol + 1;
    if (in.size() < data + n + 1) return 0;
    size_t after = data + n;
    if (in[after] == '\r') {
      if (in.size() < after + 2) return 0;
      ++after;
    }
    if (in[after] != '\n') {
      why = "a chunk is not followed by CRLF";
      return 400;
    }
    body.append(in, data, n);
    pos = after + 1;
  }
}

int inflate_body(const std::string& in, std::string& out, size_t max_out, std::string& why) {
  z_stream z{};
  // 15 + 32: a zlib or gzip header, detected; raw deflate is retried below.
  for (int window : {15 + 32, -15}) {
    out.clear();
    z = z_stream{};
    if (inflateInit2(&z, window) != Z_OK) {
      why = "cannot start zlib";
      return 400;
    }
    z.next_in = (Bytef*)in.data();
    z.avail_in = (uInt)in.size();
    char buf[16384];
    int ret = Z_OK;
    while (ret != Z_STREAM_END) {
      z.next_out = (Bytef*)buf;
      z.avail_out = sizeof buf;
      ret = inflate(&z, Z_NO_FLUSH);
      if (ret != Z_OK && ret != Z_STREAM_END) break;
      const size_t got = sizeof buf - z.avail_out;
      if (out.size() + got > max_out) {
        inflateEnd(&z);
        why = fmt::format("the decompressed body is larger than the limit of {} bytes (--max-body)", max_out);
        return 413;
      }
      out.append(buf, got);
      if (ret == Z_OK && got == 0 && z.avail_in == 0) break;  // truncated input
    }
    inflateEnd(&z);
    if (ret == Z_STREAM_END) return 0;
  }
  why = "the compressed request body is corrupt or truncated";
  return 400;
}

struct GuardedServer::State {
  HttpLimits lim;
  std::function<void(int)> on_reject;
  std::mutex mu;
  struct Conn {
    bool evictable;  // idle between requests or still sending its request
    Clock::time_point since;
  };
  std::map<int, Conn> conns;
  std::atomic<bool> stopping{false};

  // A thread for the connection, or false (503). At the cap the oldest evictable connection makes room.
  bool admit(int fd) {
    std::lock_guard lk(mu);
    if (stopping.load()) return false;
    if ((int)conns.size() >= lim.max_connections) {
      auto victim = conns.end();
      for (auto it = conns.begin(); it != conns.end(); ++it)
        if (it->second.evictable && (victim == conns.end() || it->second.since < victim->second.since))
          victim = it;
      if (victim == conns.end()) return false;
      ::shutdown(victim->first, SHUT_RDWR);  // its thread sees the end and leaves
      conns.erase(victim);
    }
    conns[fd] = Conn{true, Clock::now()};
    return true;
  }
  void set_evictable(int fd, bool e) {
    std::lock_guard lk(mu);
    auto it = conns.find(fd);
    if (it != conns.end()) it->second = Conn{e, Clock::now()};
  }
  void leave(int fd) {
    std::lock_guard lk(mu);
    conns.erase(fd);
  }

  void reject(int fd, int status, const std::string& why) {
    if (on_reject) on_reject(status);
    const std::string body = error_body(status, why);
    const std::string head = fmt::format(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n",
        status, reason(status), body.size(), status == 503 ? "Retry-After: 1\r\n" : "");
    const std::string all = head + body;
    if (!write_all(fd, all.data(), all.size(), 1000)) return;
    // A lingering close: the client may still be sending what we will not read; reading it for a moment
    // keeps the kernel from resetting the connection before the client has read the answer.
    ::shutdown(fd, SHUT_WR);
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    char buf[16384];
    size_t drained = 0;
    while (drained < (64u << 20)) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, ms_left(deadline)) <= 0) break;
      const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
      if (r <= 0) break;
      drained += (size_t)r;
    }
  }

  // Reads more of the request into `in` before `deadline`: 1, 0 on timeout, -1 when the client closed.
  static int read_more(int fd, std::string& in, Clock::time_point deadline) {
    pollfd pfd{fd, POLLIN, 0};
    const int p = ::poll(&pfd, 1, ms_left(deadline));
    if (p == 0) return 0;
    if (p < 0) return errno == EINTR ? 1 : -1;
    char buf[16384];
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
    if (r <= 0) return -1;
    in.append(buf, (size_t)r);
    return 1;
  }

  // One request from `in` and the socket, normalized into `request`. 0: done; -1: the client left or
  // stayed silent (close without an answer); otherwise the status to refuse it with, and `why`.
  int read_request(int fd, std::string& in, std::string& request, std::string& why, bool first) {
    const auto idle_deadline = Clock::now() + std::chrono::milliseconds(lim.idle_timeout_ms);
    while (in.empty()) {
      const int r = read_more(fd, in, first ? idle_deadline + std::chrono::milliseconds(lim.header_timeout_ms)
                                            : idle_deadline);
      if (r <= 0 || stopping.load()) return -1;
    }
    const auto head_deadline = Clock::now() + std::chrono::milliseconds(lim.header_timeout_ms);
    size_t head_end = std::string::npos, body_start = 0;
    while (true) {
      while (!in.empty() && (in[0] == '\r' || in[0] == '\n')) in.erase(0, 1);  // RFC 9112: ignore leading CRLF
      const size_t a = in.find("\r\n\r\n"), b = in.find("\n\n");
      if (a != std::string::npos && (b == std::string::npos || a < b)) {
        head_end = a;
        body_start = a + 4;
      } else if (b != std::string::npos) {
        head_end = b;
        body_start = b + 2;
      }
      if (head_end != std::string::npos && head_end <= lim.max_header_bytes) break;
      if (in.size() > lim.max_header_bytes) {
        why = fmt::format("the request head is larger than {} bytes", lim.max_header_bytes);
        return 431;
      }
      const int r = read_more(fd, in, head_deadline);
      if (r < 0) return -1;
      if (r == 0) {
        why = fmt::format("the request head did not arrive within {} ms", lim.header_timeout_ms);
        return 408;
      }
    }
    RequestHead head;
    if (int st = parse_request_head(in.substr(0, head_end), lim, head, why)) return st;
    if (head.has_length && head.content_length > lim.max_body_bytes) {
      why = fmt::format("the request body is larger than the limit of {} bytes (--max-body)", lim.max_body_bytes);
      return 413;
    }
    const bool has_body = head.chunked || head.content_length > 0;
    if (head.expect_continue && has_body && in.size() == body_start) {
      const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
      if (!write_all(fd, cont, sizeof cont - 1, lim.write_timeout_ms)) return -1;
    }
    const auto body_deadline = Clock::now() + std::chrono::milliseconds(lim.body_timeout_ms);
    std::string body;
    size_t consumed = body_start;
    if (head.chunked) {
      size_t pos = body_start;
      while (true) {
        const int st = decode_chunked(in, pos, body, lim.max_body_bytes, why);
        if (st == 1) break;
        if (st != 0) return st;
        const int r = read_more(fd, in, body_deadline);
        if (r < 0) return -1;
        if (r == 0) {
          why = fmt::format("the request body did not arrive within {} ms", lim.body_timeout_ms);
          return 408;
        }
      }
      consumed = pos;
    } else if (head.content_length > 0) {
      while (in.size() < body_start + head.content_length) {
        const int r = read_more(fd, in, body_deadline);
        if (r < 0) return -1;
        if (r == 0) {
          why = fmt::format("the request body did not arrive within {} ms", lim.body_timeout_ms);
          return 408;
        }
      }
      body.assign(in, body_start, head.content_length);
      consumed = body_start + head.content_length;
    }
    in.erase(0, consumed);
    if (!head.content_encoding.empty() && head.content_encoding != "identity") {
      std::string plain;
      if (int st = inflate_body(body, plain, lim.max_body_bytes, why)) return st;
      body = std::move(plain);
    }
    request = head.request_line + "\r\n";
    for (auto& [name, value] : head.headers) {
      const std::string key = lower(name);
      if (key == "content-length" || key == "transfer-encoding" || key == "content-encoding" || key == "expect")
        continue;
      request += name + ": " + value + "\r\n";
    }
    request += fmt::format("Content-Length: {}\r\n\r\n", body.size());
    request += body;
    return 0;
  }
};

GuardedServer::GuardedServer() : st_(std::make_unique<State>()) {
  new_task_queue = [this] { return new ConnectionPool((size_t)st_->lim.max_connections + 32); };
}

GuardedServer::~GuardedServer() = default;

void GuardedServer::set_limits(const HttpLimits& limits) {
  st_->lim = limits;
  set_payload_max_length(limits.max_body_bytes);
  set_write_timeout(limits.write_timeout_ms / 1000, (limits.write_timeout_ms % 1000) * 1000);
}

void GuardedServer::set_reject_counter(std::function<void(int)> fn) { st_->on_reject = std::move(fn); }

void GuardedServer::begin_stop() {
  st_->stopping.store(true);
  std::lock_guard lk(st_->mu);
  for (auto& [fd, c] : st_->conns)
    if (c.evictable) ::shutdown(fd, SHUT_RDWR);
}

bool GuardedServer::client_gone() { return t_fd >= 0 && hung_up(t_fd); }

bool GuardedServer::process_and_close_socket(socket_t fd) {
  State& s = *st_;
  if (t_overflow || !s.admit(fd)) {
    s.reject(fd, 503, s.stopping.load() ? "the server is shutting down"
                                        : "too many connections; retry shortly");
    ::close(fd);
    return false;
  }
  t_fd = fd;
  std::string in, request, why;
  bool ok = true;
  for (int n = 0; n < s.lim.max_requests_per_connection; ++n) {
    s.set_evictable(fd, true);
    const int st = s.read_request(fd, in, request, why, n == 0);
    if (st < 0) break;
    if (st > 0) {
      s.reject(fd, st, why);
      ok = false;
      break;
    }
    s.set_evictable(fd, false);
    MemoryRequestStream strm(fd, std::move(request), s.lim.write_timeout_ms);
    const bool close_after = s.stopping.load() || n + 1 == s.lim.max_requests_per_connection;
    bool closed = false;
    ok = process_request(strm, close_after, closed, [](httplib::Request&) {});
    if (!ok || closed || close_after || s.stopping.load()) break;
  }
  t_fd = -1;
  s.leave(fd);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  return ok;
}

}  // namespace xpert::server
