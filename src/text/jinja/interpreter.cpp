#include "text/jinja/interpreter.h"

#include <cmath>

#include "text/jinja/builtins.h"
#include "text/jinja/parser.h"

namespace xpert::jinja {
namespace {

int64_t floor_div(int64_t x, int64_t y) {
  int64_t q = x / y;
  if (x % y != 0 && ((x < 0) != (y < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t x, int64_t y) {
  int64_t r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return r;
}

Value repeat(const Value& seq, int64_t times, size_t max_bytes) {
  const int64_t n = std::max<int64_t>(times, 0);
  if (seq.is_string()) {
    if (static_cast<double>(seq.str().size()) * static_cast<double>(n) > static_cast<double>(max_bytes)) {
      raise("string repetition would exceed the output limit");
    }
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  if (static_cast<double>(seq.items().size()) * static_cast<double>(n) > static_cast<double>(max_bytes)) {
    raise("list repetition would exceed the output limit");
  }
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.is_tuple());
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, size_t max_bytes) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = numbers && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) return Value::integer(a.as_int() + b.as_int());
    if (numbers) return Value::floating(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) return Value::string(a.str() + b.str());
    if (a.is_list() && b.is_list()) {
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(out), a.is_tuple());
    }
  } else if (op == "-") {
    if (ints) return Value::integer(a.as_int() - b.as_int());
    if (numbers) return Value::floating(a.as_double() - b.as_double());
  } else if (op == "*") {
    if (ints) return Value::integer(a.as_int() * b.as_int());
    if (numbers) return Value::floating(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool()))
      return repeat(a, b.as_int(), max_bytes);
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool()))
      return repeat(b, a.as_int(), max_bytes);
  } else if (op == "/") {
    if (numbers) {
      if (b.as_double() == 0) raise("division by zero");
      return Value::floating(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (numbers) {
      if (b.as_double() == 0) raise("integer division or modulo by zero");
      if (ints)
        return Value::integer(op == "//" ? floor_div(a.as_int(), b.as_int())
                                         : floor_mod(a.as_int(), b.as_int()));
      const double x = a.as_double(), y = b.as_double();
      if (op == "//") return Value::floating(std::floor(x / y));
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::floating(r);
    }
    if (op == "%" && a.is_string()) raise("unsupported construct: printf-style string formatting ('%')");
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), exp = b.as_int(), result = 1;
      while (exp > 0) {
        if (exp & 1) result *= base;
        base *= base;
        exp >>= 1;
      }
      return Value::integer(result);
    }
    if (numbers) return Value::floating(std::pow(a.as_double(), b.as_double()));
  }
  raise("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

}  // namespace

Interpreter::Interpreter(const RenderSettings& settings, const Value& variables) : settings_(settings) {
  frames_.emplace_back();
  add_globals(frames_[0].vars);
  if (variables.is_dict()) {
    for (const auto& [k, v] : variables.entries().items()) frames_[0].vars[k] = v;
  }
}

void Interpreter::render(const Body& body, std::string& out) {
  if (exec_body(body, out) != Flow::normal) fail("{{% break %}} or {{% continue %}} outside a for loop");
}

void Interpreter::append(std::string& out, std::string_view s) const {
  if (out.size() + s.size() > settings_.max_output_bytes) {
    raise("rendered text exceeds {} bytes", settings_.max_output_bytes);
  }
  out.append(s);
}

Value Interpreter::lookup(const std::string& name) const {
  for (size_t i = frames_.size(); i-- > 0;) {
    auto it = frames_[i].vars.find(name);
    if (it != frames_[i].vars.end()) return it->second;
    if (frames_[i].barrier && i > 1) i = 1;  // macros see their own frame, then the top level
  }
  return Value::undefined(fmt::format("'{}' is undefined", name));
}

void Interpreter::assign(const std::string& name, Value v) { frames_.back().vars[name] = std::move(v); }

void Interpreter::bind_targets(const std::vector<std::string>& targets, const Value& item, int line) {
  if (targets.size() == 1) {
    assign(targets[0], item);
    return;
  }
  List parts = item.is_string() || item.is_list() || item.is_dict() ? iterate(item) : List{};
  if (!(item.is_string() || item.is_list() || item.is_dict()) || parts.size() != targets.size()) {
    fail("line {}: cannot unpack {} into {} variables", line, item.type_name(), targets.size());
  }
  for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], parts[i]);
}

std::string Interpreter::render_block(const Body& body) {
  std::string out;
  exec_body(body, out);
  return out;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec(*s, out);
    if (f != Flow::normal) return f;
  }
  return Flow::normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, std::string& out) {
  try {
    switch (s.kind) {
      case Stmt::Kind::text:
        append(out, s.text);
        break;
      case Stmt::Kind::output:
        append(out, eval(*s.expr).to_str());
        break;
      case Stmt::Kind::if_chain:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (eval(*s.conditions[i]).truthy()) return exec_body(s.bodies[i], out);
        }
        return exec_body(s.else_body, out);
      case Stmt::Kind::for_loop:
        return exec_for(s, out);
      case Stmt::Kind::set:
        exec_set(s);
        break;
      case Stmt::Kind::set_block:
      case Stmt::Kind::filter_block: {
        Value v = Value::string(render_block(s.body));
        if (s.expr) {
          frames_.emplace_back();
          assign(kBlockBody, v);
          v = eval(*s.expr);
          frames_.pop_back();
        }
        if (s.kind == Stmt::Kind::set_block) {
          assign(s.targets[0], v);
        } else {
          append(out, v.to_str());
        }
        break;
      }
      case Stmt::Kind::macro:
        assign(s.text, make_macro(s));
        break;
      case Stmt::Kind::call_block: {
        CallArgs args;
        Value callee = eval(*s.expr->a);
        eval_args(*s.expr, args);
        args.keyword.emplace_back("caller", make_macro(s));
        append(out, call(callee, args).to_str());
        break;
      }
      case Stmt::Kind::do_expr:
        eval(*s.expr);
        break;
      case Stmt::Kind::brk:
        return Flow::brk;
      case Stmt::Kind::cont:
        return Flow::cont;
      case Stmt::Kind::generation:
        return exec_body(s.body, out);
    }
  } catch (const RuntimeError& e) {
    fail("line {}: {}", s.line, e.what());
  }
  return Flow::normal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, std::string& out) {
  const Value seq = eval(*s.expr);
  List items = iterate(seq);
  if (s.cond) {
    List kept;
    for (Value& item : items) {
      frames_.emplace_back();
      bind_targets(s.targets, item, s.line);
      const bool keep = eval(*s.cond).truthy();
      frames_.pop_back();
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(s.else_body, out);
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    Value loop = Value::dict();
    Dict& d = loop.entries();
    d.set("index", Value::integer(i + 1));
    d.set("index0", Value::integer(i));
    d.set("revindex", Value::integer(n - i));
    d.set("revindex0", Value::integer(n - i - 1));
    d.set("first", Value::boolean(i == 0));
    d.set("last", Value::boolean(i == n - 1));
    d.set("length", Value::integer(n));
    d.set("depth", Value::integer(1));
    d.set("depth0", Value::integer(0));
    d.set("previtem",
          i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("'loop.previtem' is undefined"));
    d.set("nextitem",
          i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("'loop.nextitem' is undefined"));
    d.set("cycle", Value::function("loop.cycle", [i](Interpreter&, CallArgs& args) {
            if (args.positional.empty()) raise("loop.cycle() needs at least one argument");
            return args.positional[static_cast<size_t>(i) % args.positional.size()];
          }));
    frames_.emplace_back();
    assign("loop", loop);
    bind_targets(s.targets, items[static_cast<size_t>(i)], s.line);
    const Flow f = exec_body(s.body, out);
    frames_.pop_back();
    if (f == Flow::brk) break;
  }
  return Flow::normal;
}

void Interpreter::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.attr.empty()) {
    Value target = lookup(s.targets[0]);
    if (!target.is_namespace()) {
      raise("cannot assign attribute '{}' on '{}': only namespace() objects take attributes", s.attr,
            s.targets[0]);
    }
    target.entries().set(s.attr, std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    assign(s.targets[0], std::move(v));
  } else {
    bind_targets(s.targets, v, s.line);
  }
}

Value Interpreter::make_macro(const Stmt& s) {
  const Stmt* def = &s;
  return Value::function(s.kind == Stmt::Kind::macro ? s.text : "caller",
                         [this, def](Interpreter&, CallArgs& args) { return call_macro(*def, args); });
}

Value Interpreter::call_macro(const Stmt& s, CallArgs& args) {
  if (args.positional.size() > s.targets.size()) {
    raise("macro '{}' takes {} argument(s), {} given", s.text, s.targets.size(), args.positional.size());
  }
  frames_.emplace_back();
  frames_.back().barrier = true;
  Value kwargs = Value::dict();
  for (size_t i = 0; i < s.targets.size(); ++i) {
    const Value* v = args.get(i, s.targets[i]);
    if (v) {
      assign(s.targets[i], *v);
    } else if (s.defaults[i]) {
      assign(s.targets[i], eval(*s.defaults[i]));
    } else {
      assign(s.targets[i], Value::undefined(fmt::format("'{}' is undefined", s.targets[i])));
    }
  }
  for (auto& [k, v] : args.keyword) {
    if (std::find(s.targets.begin(), s.targets.end(), k) == s.targets.end()) {
      if (k == "caller") {
        assign("caller", v);
      } else {
        kwargs.entries().set(k, v);
      }
    }
  }
  assign("kwargs", kwargs);
  std::string out;
  exec_body(s.body, out);
  frames_.pop_back();
  return Value::string(std::move(out));
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  if (!callee.is_function()) raise("'{}' object is not callable", callee.type_name());
  if (++depth_ > settings_.max_call_depth) {
    depth_ = 0;
    raise("maximum call depth ({}) exceeded", settings_.max_call_depth);
  }
  Value result = callee.fn().call(*this, args);
  --depth_;
  return result;
}

void Interpreter::eval_args(const Expr& e, CallArgs& args) {
  for (const ExprPtr& a : e.items) args.positional.push_back(eval(*a));
  for (const auto& [k, a] : e.keywords) args.keyword.emplace_back(k, eval(*a));
}

Value Interpreter::eval_call(const Expr& e) {
  if (e.a->kind == Expr::Kind::attribute) {
    const Value obj = eval(*e.a->a);
    CallArgs args;
    eval_args(e, args);
    Value result;
    if (!obj.is_undefined() && call_method(*this, obj, e.a->name, args, result)) return result;
    return call(attribute_of(obj, e.a->name), args);
  }
  const Value callee = eval(*e.a);
  CallArgs args;
  eval_args(e, args);
  return call(callee, args);
}

Value Interpreter::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  if (op == "and") {
    Value a = eval(*e.a);
    return a.truthy() ? eval(*e.b) : a;
  }
  if (op == "or") {
    Value a = eval(*e.a);
    return a.truthy() ? a : eval(*e.b);
  }
  const Value a = eval(*e.a);
  const Value b = eval(*e.b);
  if (op == "==") return Value::boolean(equals(a, b));
  if (op == "!=") return Value::boolean(!equals(a, b));
  if (op == "<") return Value::boolean(compare(a, b) < 0);
  if (op == "<=") return Value::boolean(compare(a, b) <= 0);
  if (op == ">") return Value::boolean(compare(a, b) > 0);
  if (op == ">=") return Value::boolean(compare(a, b) >= 0);
  if (op == "in") return Value::boolean(contains(b, a));
  if (op == "not in") return Value::boolean(!contains(b, a));
  if (op == "~") return Value::string(a.to_str() + b.to_str());
  return arithmetic(op, a, b, settings_.max_output_bytes);
}

Value Interpreter::eval(const Expr& e) {
  try {
    switch (e.kind) {
      case Expr::Kind::literal:
        return e.value;
      case Expr::Kind::name:
        return lookup(e.name);
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List items;
        for (const ExprPtr& x : e.items) items.push_back(eval(*x));
        return Value::list(std::move(items), e.kind == Expr::Kind::tuple);
      }
      case Expr::Kind::dict: {
        Value d = Value::dict();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          const Value key = eval(*e.items[i]);
          if (!key.is_string())
            raise("unsupported construct: dict literal keys must be strings, got {}", key.type_name());
          d.entries().set(key.str(), eval(*e.items[i + 1]));
        }
        return d;
      }
      case Expr::Kind::attribute:
        return attribute_of(eval(*e.a), e.name);
      case Expr::Kind::subscript: {
        const Value obj = eval(*e.a);
        return item_of(obj, eval(*e.b));
      }
      case Expr::Kind::slice: {
        const Value obj = eval(*e.a);
        return slice_of(obj, e.b ? eval(*e.b) : Value::none(), e.c ? eval(*e.c) : Value::none(),
                        e.d ? eval(*e.d) : Value::none());
      }
      case Expr::Kind::call:
        return eval_call(e);
      case Expr::Kind::filter: {
        const Value input = eval(*e.a);
        CallArgs args;
        eval_args(e, args);
        return apply_filter(*this, e.name, input, args);
      }
      case Expr::Kind::test: {
        const Value input = eval(*e.a);
        CallArgs args;
        eval_args(e, args);
        return Value::boolean(apply_test(*this, e.name, input, args) != e.negate);
      }
      case Expr::Kind::unary: {
        const Value a = eval(*e.a);
        if (e.name == "not") return Value::boolean(!a.truthy());
        if (a.is_undefined()) undefined_error(a);
        if (!a.is_number()) raise("bad operand type for unary {}: '{}'", e.name, a.type_name());
        if (e.name == "+") return a.is_bool() ? Value::integer(a.as_int()) : a;
        return a.is_float() ? Value::floating(-a.as_double()) : Value::integer(-a.as_int());
      }
      case Expr::Kind::binary:
        return eval_binary(e);
      case Expr::Kind::conditional:
        if (eval(*e.a).truthy()) return eval(*e.b);
        return e.c ? eval(*e.c) : Value::undefined("the conditional expression has no else branch");
    }
  } catch (const RuntimeError& err) {
    fail("line {}: {}", e.line, err.what());
  }
  return Value();
}

// ---- Template ----

Template::Template(std::string_view source, const LexOptions& options)
    : program_(std::make_shared<Program>(parse(source, options))) {}

std::string Template::render(const Value& variables, const RenderSettings& settings) const {
  Interpreter in(settings, variables);
  std::string out;
  in.render(program_->body, out);
  return out;
}

}  // namespace xpert::jinja
