// What the route files of the server share: the served model and its helpers (tokenizing as the server
// does, rendering chat templates with assistant prefill, submitting jobs with OpenAI's errors), route
// registration (every /v1 route also answers without /v1; other methods get 405), and a pump that
// drives several jobs at once for n > 1 and many prompts. Each API family registers its routes from its
// own file (completions.cpp, text_routes.cpp, embeddings.cpp, responses_api.cpp, anthropic_api.cpp).
#pragma once
#include <httplib.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/chat_prompt.h"
#include "server/openai.h"
#include "server/server.h"
#include "text/chat_template.h"

namespace xpert::server {

// How errors are written: OpenAI's {"error": {message, type, param, code}} or Anthropic's
// {"type": "error", "error": {type, message}}.
enum class ErrorStyle { openai, anthropic };
ErrorStyle error_style_of(const std::string& path);
void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                const std::string& code = {}, const std::string& type = {},
                ErrorStyle style = ErrorStyle::openai);

std::string random_id(const char* prefix);
int64_t unix_now();

struct Context {
  ServeOptions opts;
  ServedModel m;
  std::atomic<bool> ready{false}, stopping{false};

  // Text -> ids as the server reads prompts: special tokens written in the text are parsed, and one BOS
  // is added where the model wants it (a rendered template may start with it already).
  std::vector<int32_t> tokenize(const std::string& text) const;
  // A chat prompt: control tokens only where the template put them, never inside the user's text.
  std::vector<int32_t> tokenize(const ChatPrompt& prompt) const;
  // The model name a response reports: the requested one (any name is served by the one model) or the
  // served id; with --strict-model another name is a 404.
  std::string model_name(const std::string& requested) const;
  // The chat prompt of `messages` (checked as OpenAI's chat messages). A last assistant message is
  // continued, not closed: the prompt is the conversation before it with the generation prompt, plus
  // its text (prefill). Template failures are a 400 naming `param`.
  // The template's fallbacks (ChatRenderOptions::fallbacks) are on: tools, tool turns and `developer` are
  // rendered even where the template lacks them.
  ChatPrompt render_chat(const ojson& messages, const ojson& tools, const std::string& param) const;
  ChatPrompt render_chat(const ojson& messages, ChatRenderOptions options, const std::string& param) const;
  // The context check every API makes before submitting (400 context_length_exceeded).
  void check_prompt_fits(const std::vector<int32_t>& prompt, const std::string& param) const;
  // Submits to the engine: a full queue is a 503 with Retry-After, other refusals a 400.
  std::shared_ptr<Job> submit(GenerateParams p, httplib::Response& res) const;
};

using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

// Registers routes on the server, each wrapped so an ApiError becomes its status in the route's error
// style and nothing unexpected escapes as a crash. A path "/v1/x" is also served as "/x".
class Router {
 public:
  Router(httplib::Server& http, Context& ctx) : http_(http), ctx_(ctx) {}
  void get(const std::string& path, Handler h);
  void post(const std::string& path, Handler h);
  // Known paths with another method: 405 with Allow (call after every route is added).
  void finish();
  // Paths registered (for the metrics' endpoint label).
  const std::set<std::string>& paths() const { return paths_; }
  Context& ctx() { return ctx_; }

 private:
  void add(const std::string& method, const std::string& path, Handler h);
  httplib::Server& http_;
  Context& ctx_;
  std::set<std::string> paths_;
  std::vector<std::pair<std::string, std::string>> routes_;  // path, method
};

// One output of a job, as it arrives.
struct JobOutput {
  size_t index = 0;  // which job
  Job::Update update;
};

// Waits on several jobs until all end. `on` is called for each update (text, logprobs, the final one
// with finish set); returning false stops: every job is cancelled and pump returns false. `idle` is
// called about once a second while nothing arrives (streams send a keep-alive there; false stops too).
// A server shutdown cancels the jobs and throws ApiError 503; a client that closed its connection (seen
// on the socket, streaming or not) cancels them and throws ApiError 499.
bool pump(const Context& ctx, const std::vector<std::shared_ptr<Job>>& jobs,
          const std::function<bool(JobOutput&)>& on, const std::function<bool()>& idle = {});

// Everything a job produced, for non-streaming responses; a generation error is a 500.
struct Collected {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  Finish finish = Finish::none;
  int stop_index = -1;
};
std::vector<Collected> collect(const Context& ctx, const std::vector<std::shared_ptr<Job>>& jobs);

// An SSE stream from a producer that writes events through `send` (false: the client left).
// A producer's ApiError (a shutdown is a 503; anything else it throws is a 500) ends the stream with what
// `error_event` makes of it, in the stream's protocol: by default OpenAI's error chunk and [DONE];
// anthropic_error_event for Messages; the Responses API makes its own (an `error` event with a
// sequence number).
using SseProducer = std::function<void(const std::function<bool(const std::string&)>& send)>;
using SseErrorEvent = std::function<std::string(const ApiError&)>;
std::string openai_error_event(const ApiError& e);     // data: {"error": {...}} then data: [DONE]
std::string anthropic_error_event(const ApiError& e);  // event: error, {"type": "error", "error": {...}}
void stream_sse(httplib::Response& res, std::vector<std::shared_ptr<Job>> jobs, SseProducer producer,
                SseErrorEvent error_event = openai_error_event);

// Route families.
void add_completion_routes(Router& r);
void add_text_routes(Router& r);
void add_embedding_routes(Router& r);
void add_responses_routes(Router& r);
void add_anthropic_routes(Router& r);

}  // namespace xpert::server
