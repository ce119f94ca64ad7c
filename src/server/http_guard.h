// The HTTP layer's limits, held by construction. Debian's cpp-httplib (0.11.4, a shared library, so its
// compile-time limits are fixed) reads request bodies without bound when they are chunked or gzip, counts
// no headers, and lets a client that trickles bytes hold a thread forever. So GuardedServer reads every
// request itself, under HttpLimits (head size and header count, deadlines for the head and the body, the
// body's size after dechunking and inflating), and hands httplib a normalized copy from memory
// (Content-Length, decoded body); httplib never reads the socket. Connections run on their own threads,
// at most max_connections; when full, the oldest idle or still-sending connection makes room, so slow or
// idle clients never starve /health or anyone else.
#pragma once
#include <httplib.h>

#include <functional>
#include <memory>
#include <string>

namespace xpert::server {

struct HttpLimits {
  size_t max_body_bytes = 1 << 20;      // after dechunking and decompression (--max-body)
  size_t max_header_bytes = 32 << 10;   // request line and headers together
  int max_headers = 100;
  int header_timeout_ms = 10'000;       // the whole head, from its first byte
  int body_timeout_ms = 60'000;         // the whole body
  int idle_timeout_ms = 5'000;          // a kept-alive connection waiting for its next request
  int write_timeout_ms = 10'000;        // one write waiting for a client that does not read
  int max_connections = 256;
  int max_requests_per_connection = 100;
};

class GuardedServer : public httplib::Server {
 public:
  GuardedServer();
  ~GuardedServer() override;
  void set_limits(const HttpLimits& limits);
  // Requests the guard refuses itself (never reaching a handler) are reported here with their status.
  void set_reject_counter(std::function<void(int status)> fn);
  // Shutdown, first half: new connections get 503; idle and still-sending ones are closed now. Requests in
  // handlers finish (handlers watch their own stop flag); then httplib::Server::stop().
  void begin_stop();

  // On a handler's thread: the client of this request closed its connection (hung up or reset).
  static bool client_gone();
  // Serves one accepted connection on the calling thread and closes it, as the listener's threads do
  // (for the fuzz target, which feeds connections from a socketpair).
  bool serve_socket(socket_t sock) { return process_and_close_socket(sock); }

 private:
  bool process_and_close_socket(socket_t sock) override;
  struct State;
  std::unique_ptr<State> st_;
};

// One request's head as the guard parses it (exposed for the fuzz target and unit tests).
struct RequestHead {
  std::string request_line;
  std::vector<std::pair<std::string, std::string>> headers;  // names as sent
  bool has_length = false, chunked = false, expect_continue = false;
  uint64_t content_length = 0;
  std::string content_encoding;  // lower case; empty or "identity": none
};
// Parses `head` (without the blank line). Returns 0, or the HTTP status to refuse it with, and a message.
int parse_request_head(const std::string& head, const HttpLimits& limits, RequestHead& out, std::string& why);
// Decodes a chunked body from `in` starting at `pos` (advanced past what was consumed). Returns 1 when
// the last chunk and trailers were read, 0 when more input is needed, or an HTTP status (400, 413).
int decode_chunked(const std::string& in, size_t& pos, std::string& body, size_t max_body, std::string& why);
// gzip / deflate (zlib or raw) into `out`, at most max_out bytes. Returns 0, 400 (corrupt) or 413.
int inflate_body(const std::string& in, std::string& out, size_t max_out, std::string& why);

}  // namespace xpert::server
