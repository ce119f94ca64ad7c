// libFuzzer target for the server's request path, from raw bytes on a connection to the engine's
// GenerateParams: the input is what a client sends on one connection (one or more pipelined requests).
// It goes through the real GuardedServer (head and header limits, Content-Length, chunked and gzip
// bodies, Expect) over a socketpair, then httplib's parser, the AccessPolicy (Host, Origin, API key), and
// the request parsers of every generating API: chat completions and completions (SSE options included),
// Anthropic's messages and count_tokens, and OpenAI's responses. No model, no engine, no network.
//
// A bug is: a crash or sanitizer report; an exception from a parser other than ApiError (the route
// would answer 500 instead of naming the field); an ApiError that is not a 4xx; a body larger than the
// limit reaching a handler; parsed parameters out of their documented ranges; a response on the wire
// that is not HTTP/1.1 with a status line.
#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "../common/request_checks.h"
#include "server/access.h"
#include "server/api_requests.h"
#include "server/http_guard.h"
#include "server/openai.h"

namespace {

using namespace xpert::server;

constexpr size_t kMaxBody = 64 << 10;

[[noreturn]] void defect(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_http: %s: %s\n", what, detail.c_str());
  __builtin_trap();
}

// What each route runs before it renders a prompt and submits, and the parameters' ranges.
void parse_for(const std::string& path, const std::string& body) {
  if (const std::string d = checks::check_request(path, body); !d.empty())
    defect("parameters out of range", d);
}

bool gzip(const std::string& in, std::string& out) {
  z_stream z{};
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return false;
  out.resize(deflateBound(&z, in.size()) + 32);
  z.next_in = (Bytef*)in.data();
  z.avail_in = (uInt)in.size();
  z.next_out = (Bytef*)out.data();
  z.avail_out = (uInt)out.size();
  const int r = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return r == Z_STREAM_END;
}

struct Harness {
  GuardedServer http;
  AccessPolicy open_policy{AccessOptions{}};
  AccessPolicy keyed_policy{AccessOptions{.api_key = "sk-fuzz", .cors_origins = {"https://ok.example"}}};

  Harness() {
    HttpLimits lim;
    lim.max_body_bytes = kMaxBody;
    lim.max_header_bytes = 8 << 10;
    lim.max_headers = 32;
    lim.max_requests_per_connection = 8;
    http.set_limits(lim);
    using HR = httplib::Server::HandlerResponse;
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (req.body.size() > kMaxBody) defect("a body over the limit reached the handlers", std::to_string(req.body.size()));
      // Both policies on every request: the keyed one must refuse whatever lacks the key.
      if (const auto refusal = open_policy.check(req, res)) {  // the server's own policy (no key)
        if (refusal->status) res.status = refusal->status;
        return HR::Handled;
      }
      httplib::Response keyed_res;
      const auto refusal = keyed_policy.check(req, keyed_res);
      if (refusal && refusal->status != 0 && refusal->status != 401 && refusal->status != 403)
        defect("access refusal with an odd status", std::to_string(refusal->status));
      if (!refusal && !AccessPolicy::is_public(req.method, req.path) && req.method != "OPTIONS") {
        const bool keyed = (req.get_header_value("Authorization") + req.get_header_value("x-api-key")).find("sk-fuzz") !=
                           std::string::npos;
        if (!keyed) defect("a request without the key passed the keyed policy", req.method + " " + req.path);
      }
      return HR::Unhandled;
    });
    for (const char* p : {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                          "/v1/responses"}) {
      http.Post(p, [path = std::string(p)](const httplib::Request& req, httplib::Response& res) {
        try {
          parse_for(path, req.body);
          res.status = 200;
        } catch (const ApiError& e) {
          if (const std::string d = checks::refusal_defect(e); !d.empty()) defect("a bad refusal", d);
          res.status = e.status;
          res.set_content(e.what(), "text/plain");
        } catch (const std::exception& e) {
          defect("a parser threw something other than ApiError", e.what());
        }
      });
    }
  }
};

// A well-framed request around a JSON body, so mutations of the body are not lost to a Content-Length
// that no longer matches. Byte 0 (below 0x20): bits 0-2 the route, bit 3 chunked, bit 4 gzip.
std::string frame(uint8_t mode, std::string body) {
  static const char* routes[] = {"/v1/chat/completions", "/v1/completions", "/v1/messages",
                                 "/v1/messages/count_tokens", "/v1/responses", "/v1/chat/completions",
                                 "/v1/messages", "/v1/responses"};
  std::string head = fmt::format("POST {} HTTP/1.1\r\nHost: localhost\r\nx-api-key: sk-fuzz\r\n", routes[mode & 7]);
  if (mode & 16) {
    std::string gz;
    if (gzip(body, gz)) {
      body = std::move(gz);
      head += "Content-Encoding: gzip\r\n";
    }
  }
  if (!(mode & 8)) return head + fmt::format("Content-Length: {}\r\n\r\n", body.size()) + body;
  head += "Transfer-Encoding: chunked\r\n\r\n";
  for (size_t i = 0; i < body.size(); i += 1000) {
    const size_t n = std::min<size_t>(1000, body.size() - i);
    head += fmt::format("{:x}\r\n", n) + body.substr(i, n) + "\r\n";
  }
  return head + "0\r\n\r\n";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Harness* h = new Harness();  // never destroyed: httplib's server outlives every input
  std::string framed;
  if (size > 0 && data[0] < 0x20) {
    framed = frame(data[0], std::string((const char*)data + 1, size - 1));
    data = (const uint8_t*)framed.data();
    size = framed.size();
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
  // The whole input is in the socket before the guard reads; a shut write side is the client done sending.
  size_t off = 0;
  while (off < size) {
    const ssize_t w = ::write(sv[0], data + off, size - off);
    if (w <= 0) break;
    off += (size_t)w;
  }
  ::shutdown(sv[0], SHUT_WR);
  h->http.serve_socket(sv[1]);  // closes sv[1]
  std::string out;
  char buf[4096];
  ssize_t r;
  while ((r = ::read(sv[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)r);
  ::close(sv[0]);
  if (std::getenv("FUZZ_HTTP_TRACE")) std::fprintf(stderr, "%s\n", out.c_str());  // seeing what a seed reaches
  if (!out.empty() && out.rfind("HTTP/1.1 ", 0) != 0) defect("a response that is not HTTP/1.1", out.substr(0, 64));
  return 0;
}
