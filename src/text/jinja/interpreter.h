// Evaluation of a parsed Program: scopes, statements and expressions. Filters, tests, methods and
// globals live in builtins.h; they call back here for macros and nested filters.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/template.h"

namespace xpert::jinja {

class Interpreter {
 public:
  Interpreter(const RenderSettings& settings, const Value& variables);

  void render(const Body& body, std::string& out);
  Value eval(const Expr& e);
  Value call(const Value& callee, CallArgs& args);
  const RenderSettings& settings() const { return settings_; }

 private:
  enum class Flow { normal, brk, cont };
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    bool barrier = false;  // a macro's frame: lookups skip from here to the top level
  };

  Flow exec_body(const Body& body, std::string& out);
  Flow exec(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  Value make_macro(const Stmt& s);
  Value call_macro(const Stmt& s, CallArgs& args);
  Value eval_binary(const Expr& e);
  Value eval_call(const Expr& e);
  void eval_args(const Expr& e, CallArgs& args);
  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  void bind_targets(const std::vector<std::string>& targets, const Value& item, int line);
  std::string render_block(const Body& body);
  void append(std::string& out, std::string_view s) const;

  const RenderSettings& settings_;
  std::vector<Frame> frames_;  // frames_[0]: globals + the caller's variables + top-level sets
  int depth_ = 0;
};

}  // namespace xpert::jinja
