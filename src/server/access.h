// Who may use the server: the API key (--api-key), the Host header (against DNS rebinding) and the Origin
// header (--cors-origins), checked before any route. A web page the operator happens to visit must not be
// able to drive a server that has no key: a browser sends its page's Origin on every cross-origin POST and
// its own host name in Host, so both are checked; clients that are not browsers send neither or their own.
#pragma once
#include <httplib.h>

#include <optional>
#include <string>
#include <vector>

namespace xpert::server {

struct AccessOptions {
  std::string api_key;                     // empty: no key
  std::vector<std::string> cors_origins;   // origins allowed besides the server's own; "*": any
  std::vector<std::string> allowed_hosts;  // Host names besides IP literals, localhost and this machine; "*": any
  std::string bind_host;                   // --host, also allowed as a Host name
};

class AccessPolicy {
 public:
  explicit AccessPolicy(AccessOptions o);
  struct Refusal {
    int status = 0;  // 401 or 403; 0: `res` already holds the answer (a CORS preflight)
    std::string message, code;
  };
  // A refusal to send instead of running the route; otherwise none, and `res` may have gained CORS
  // headers. The key: 'Authorization: Bearer KEY' (any case of Bearer) or Anthropic's 'x-api-key: KEY'.
  std::optional<Refusal> check(const httplib::Request& req, httplib::Response& res) const;

  // The pieces, for unit tests.
  bool host_allowed(const std::string& host_header) const;
  bool origin_allowed(const std::string& origin, const std::string& host_header) const;
  static bool key_matches(const std::string& authorization, const std::string& key);
  static bool is_public(const std::string& method, const std::string& path);

 private:
  AccessOptions o_;
  std::string machine_name_;
};

// "a,b , c" -> {"a","b","c"}; for flag values.
std::vector<std::string> split_list(const std::string& s);

}  // namespace xpert::server
