// `xpert serve`'s HTTP side: an OpenAI-compatible API over cpp-httplib. HTTP threads parse, check,
// render the chat template, tokenize, submit to the Engine and stream its output; they never touch
// the model. The server listens before the model is loaded so /health can answer 503 meanwhile.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace xpert {
class Model;
class Tokenizer;
class ChatTemplate;
}  // namespace xpert

namespace xpert::server {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                     // empty: no authentication
  std::vector<std::string> cors_origins;   // --cors-origins: sites besides the served page that may call
  std::vector<std::string> allowed_hosts;  // --allowed-hosts: Host names besides IPs, localhost, this machine
  size_t max_body_bytes = 1 << 20;
  int max_connections = 256;       // open connections; at the cap the oldest idle one is closed
  int header_timeout_ms = 10'000;  // a request head must arrive within this
  int body_timeout_ms = 60'000;    // and its body within this
  bool strict_model = false;  // a request naming another model is a 404 (default: the one model serves it)
};

struct ServedModel {
  const Model* model = nullptr;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  Engine* engine = nullptr;
  std::string id;                    // the name /v1/models lists (the file stem)
  std::vector<std::string> aliases;  // other names a request may use (file name, general.name)
  std::string path;                  // the model file (llama.cpp's /props model_path)
  Pooling pooling = Pooling::mean;   // /v1/embeddings
};

class Server {
 public:
  explicit Server(const ServeOptions& opts);
  ~Server();
  // Binds (throws Error when it cannot) and serves on a background thread; /v1 answers 503 until ready.
  void start();
  void set_ready(const ServedModel& m);
  // Stops accepting, ends in-flight requests (streams with an error event) and stops listening; wait()
  // then returns.
  void stop();
  void wait();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xpert::server
