#include "text/jinja/parser.h"

#include <algorithm>

namespace xpert::jinja {
namespace {

const char* kind_name(TokenKind k) {
  switch (k) {
    case TokenKind::text:
      return "text";
    case TokenKind::expr_begin:
      return "'{{'";
    case TokenKind::expr_end:
      return "'}}'";
    case TokenKind::stmt_begin:
      return "'{%'";
    case TokenKind::stmt_end:
      return "'%}'";
    case TokenKind::name:
      return "name";
    case TokenKind::string:
      return "string";
    case TokenKind::integer:
      return "integer";
    case TokenKind::floating:
      return "float";
    case TokenKind::op:
      return "operator";
    case TokenKind::end:
      return "end of template";
  }
  return "?";
}

ExprPtr make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Program run() {
    Program p;
    std::string stop;
    p.body = parse_body({}, stop);
    return p;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < toks_.size() - 1) ++pos_;
    return t;
  }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::op && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::name && peek(ahead).text == name;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  std::string describe(const Token& t) const {
    if (t.kind == TokenKind::name || t.kind == TokenKind::op) return "'" + t.text + "'";
    return kind_name(t.kind);
  }
  [[noreturn]] void error_at(const Token& t, std::string_view what) const {
    fail("line {}: expected {}, found {}", t.line, what, describe(t));
  }
  void expect_op(std::string_view op) {
    if (!accept_op(op)) error_at(peek(), fmt::format("'{}'", op));
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::name) error_at(peek(), "a name");
    return next().text;
  }
  void expect_stmt_end() {
    if (peek().kind != TokenKind::stmt_end) error_at(peek(), "'%}'");
    next();
  }

  // ---- statements ----

  // Parses until `{% <one of stops>` and leaves the position after that keyword (in `stopped`).
  Body parse_body(std::initializer_list<std::string_view> stops, std::string& stopped) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::end) {
        if (stops.size() == 0) return body;
        fail("line {}: unexpected end of template: missing {{% {} %}}", t.line, *(stops.end() - 1));
      }
      if (t.kind == TokenKind::text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::text;
        s->line = t.line;
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::expr_begin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::output;
        s->line = t.line;
        s->expr = parse_tuple();
        if (peek().kind != TokenKind::expr_end) error_at(peek(), "'}}'");
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::stmt_begin) {
        const Token& kw = peek(1);
        if (kw.kind == TokenKind::name && std::find(stops.begin(), stops.end(), kw.text) != stops.end()) {
          next();
          stopped = next().text;
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        error_at(t, "text or a tag");
      }
    }
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token& kw = peek();
    if (kw.kind != TokenKind::name) error_at(kw, "a statement name");
    const std::string name = next().text;
    auto s = std::make_unique<Stmt>();
    s->line = kw.line;
    std::string stop;
    if (name == "if") {
      s->kind = Stmt::Kind::if_chain;
      s->conditions.push_back(parse_expression());
      expect_stmt_end();
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, stop));
      while (stop == "elif") {
        s->conditions.push_back(parse_expression());
        expect_stmt_end();
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, stop));
      }
      if (stop == "else") {
        expect_stmt_end();
        s->else_body = parse_body({"endif"}, stop);
      }
      expect_stmt_end();
    } else if (name == "for") {
      s->kind = Stmt::Kind::for_loop;
      s->targets = parse_targets();
      if (!accept_name("in")) error_at(peek(), "'in'");
      s->expr = parse_tuple(/*allow_conditional=*/false);
      if (accept_name("if")) s->cond = parse_expression();
      if (is_name("recursive")) fail("line {}: unsupported construct: recursive for loops", s->line);
      expect_stmt_end();
      s->body = parse_body({"else", "endfor"}, stop);
      if (stop == "else") {
        expect_stmt_end();
        s->else_body = parse_body({"endfor"}, stop);
      }
      expect_stmt_end();
    } else if (name == "set") {
      if (peek().kind == TokenKind::name && is_op(".", 1)) {
        s->targets.push_back(next().text);
        next();
        s->attr = expect_name();
      } else {
        s->targets = parse_targets();
      }
      if (accept_op("=")) {
        s->kind = Stmt::Kind::set;
        s->expr = parse_tuple();
        expect_stmt_end();
      } else {
        if (!s->attr.empty() || s->targets.size() != 1) error_at(peek(), "'='");
        s->kind = Stmt::Kind::set_block;
        if (is_op("|")) s->expr = parse_filter_chain(placeholder(s->line));
        expect_stmt_end();
        s->body = parse_body({"endset"}, stop);
        expect_stmt_end();
      }
    } else if (name == "macro") {
      s->kind = Stmt::Kind::macro;
      s->text = expect_name();
      parse_params(*s);
      expect_stmt_end();
      s->body = parse_body({"endmacro"}, stop);
      if (peek().kind == TokenKind::name) next();  // {% endmacro name %}
      expect_stmt_end();
    } else if (name == "call") {
      s->kind = Stmt::Kind::call_block;
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression();
      if (s->expr->kind != Expr::Kind::call) fail("line {}: {{% call %}} expects a macro call", s->line);
      expect_stmt_end();
      s->body = parse_body({"endcall"}, stop);
      expect_stmt_end();
    } else if (name == "filter") {
      s->kind = Stmt::Kind::filter_block;
      s->expr = parse_filter_chain(placeholder(s->line), /*first_bar=*/false);
      expect_stmt_end();
      s->body = parse_body({"endfilter"}, stop);
      expect_stmt_end();
    } else if (name == "do") {
      s->kind = Stmt::Kind::do_expr;
      s->expr = parse_tuple();
      expect_stmt_end();
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? Stmt::Kind::brk : Stmt::Kind::cont;
      expect_stmt_end();
    } else if (name == "generation") {
      s->kind = Stmt::Kind::generation;
      expect_stmt_end();
      s->body = parse_body({"endgeneration"}, stop);
      expect_stmt_end();
    } else if (name == "include" || name == "extends" || name == "block" || name == "import" ||
               name == "from" || name == "with" || name == "autoescape" || name == "trans") {
      fail("line {}: unsupported construct: {{% {} %}}", s->line, name);
    } else {
      fail("line {}: unknown statement {{% {} %}}", s->line, name);
    }
    return s;
  }

  // Stands for the rendered body in `{% filter f %}` and `{% set x | f %}`.
  static ExprPtr placeholder(int line) {
    auto e = make(Expr::Kind::name, line);
    e->name = kBlockBody;
    return e;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = accept_op("(");
    do {
      if (is_op(")") || is_name("in") || is_op("=")) break;
      names.push_back(expect_name());
    } while (accept_op(","));
    if (paren) expect_op(")");
    if (names.empty()) error_at(peek(), "a variable name");
    return names;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      s.targets.push_back(expect_name());
      s.defaults.push_back(accept_op("=") ? parse_expression() : nullptr);
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  // ---- expressions ----

  // An expression, or a tuple when commas follow (`{{ a, b }}`, `set x = 1, 2`).
  ExprPtr parse_tuple(bool allow_conditional = true) {
    const int line = peek().line;
    ExprPtr first = parse_expression(allow_conditional);
    if (!is_op(",")) return first;
    auto t = make(Expr::Kind::tuple, line);
    t->items.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == TokenKind::stmt_end || peek().kind == TokenKind::expr_end || is_name("if")) break;
      t->items.push_back(parse_expression(allow_conditional));
    }
    return t;
  }

  // Nesting bound, so a hostile template cannot overflow the stack: ((((...)))) or deep {% if %}s.
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxDepth)
        fail("line {}: nesting deeper than {} levels", parser.peek().line, kMaxDepth);
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };
  static constexpr int kMaxDepth = 200;

  ExprPtr parse_expression(bool allow_conditional = true) {
    DepthGuard guard(*this);
    ExprPtr e = parse_or();
    while (allow_conditional && is_name("if")) {
      const int line = next().line;
      auto c = make(Expr::Kind::conditional, line);
      c->a = parse_or();
      c->b = std::move(e);
      if (accept_name("else")) c->c = parse_expression();
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::Kind::binary, line);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      e = binary("or", std::move(e), parse_and(), line);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      e = binary("and", std::move(e), parse_not(), line);
    }
    return e;
  }

  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make(Expr::Kind::unary, next().line);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const int line = peek().line;
      if (peek().kind == TokenKind::op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        std::string op = next().text;
        e = binary(op, std::move(e), parse_math1(), line);
      } else if (is_name("in")) {
        next();
        e = binary("in", std::move(e), parse_math1(), line);
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        e = binary("not in", std::move(e), parse_math1(), line);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      std::string op = t.text;
      e = binary(op, std::move(e), parse_concat(), t.line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary("~", std::move(e), parse_math2(), line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      std::string op = t.text;
      e = binary(op, std::move(e), parse_pow(), t.line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (is_op("**")) {
      const int line = next().line;
      e = binary("**", std::move(e), parse_unary(), line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter = true) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(Expr::Kind::unary, t.line);
      e->name = t.text;
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_chain(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::name: {
        next();
        auto e = make(Expr::Kind::literal, t.line);
        if (t.text == "true" || t.text == "True") {
          e->value = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->value = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->value = Value::none();
        } else {
          e->kind = Expr::Kind::name;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::string: {
        std::string s = next().text;
        while (peek().kind == TokenKind::string) s += next().text;  // adjacent literals concatenate
        auto e = make(Expr::Kind::literal, t.line);
        e->value = Value::string(std::move(s));
        return e;
      }
      case TokenKind::integer:
      case TokenKind::floating: {
        next();
        auto e = make(Expr::Kind::literal, t.line);
        e->value =
            t.kind == TokenKind::integer ? Value::integer(t.int_value) : Value::floating(t.float_value);
        return e;
      }
      case TokenKind::op:
        if (t.text == "(") {
          next();
          if (accept_op(")")) return make(Expr::Kind::tuple, t.line);
          ExprPtr e = parse_expression();
          if (is_op(",")) {
            auto tup = make(Expr::Kind::tuple, t.line);
            tup->items.push_back(std::move(e));
            while (accept_op(",") && !is_op(")")) tup->items.push_back(parse_expression());
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          next();
          auto e = make(Expr::Kind::list, t.line);
          while (!is_op("]")) {
            e->items.push_back(parse_expression());
            if (!accept_op(",")) break;
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(Expr::Kind::dict, t.line);
          while (!is_op("}")) {
            e->items.push_back(parse_expression());
            expect_op(":");
            e->items.push_back(parse_expression());
            if (!accept_op(",")) break;
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    error_at(t, "an expression");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (accept_op(".")) {
        auto a = make(Expr::Kind::attribute, line);
        if (peek().kind == TokenKind::integer) {
          a->kind = Expr::Kind::subscript;
          a->b = make(Expr::Kind::literal, line);
          a->b->value = Value::integer(next().int_value);
        } else {
          a->name = expect_name();
        }
        a->a = std::move(e);
        e = std::move(a);
      } else if (accept_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), line);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    for (int i = 0; i < 3; ++i) {
      if (!is_op(":") && !is_op("]")) parts[i] = parse_expression();
      if (i < 2 && accept_op(":")) {
        is_slice = true;
      } else {
        break;
      }
    }
    expect_op("]");
    auto e = make(is_slice ? Expr::Kind::slice : Expr::Kind::subscript, line);
    e->a = std::move(target);
    e->b = std::move(parts[0]);
    e->c = std::move(parts[1]);
    e->d = std::move(parts[2]);
    if (!is_slice && !e->b) fail("line {}: empty subscript", line);
    return e;
  }

  void parse_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**"))
        fail("line {}: unsupported construct: *args / **kwargs in a call", peek().line);
      if (peek().kind == TokenKind::name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call.keywords.emplace_back(std::move(key), parse_expression());
      } else {
        if (!call.keywords.empty()) fail("line {}: positional argument after keyword argument", peek().line);
        call.items.push_back(parse_expression());
      }
      if (!accept_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee, int line) {
    auto e = make(Expr::Kind::call, line);
    e->a = std::move(callee);
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_chain(ExprPtr e, bool first_bar = true) {
    while (true) {
      const int line = peek().line;
      if (!first_bar || accept_op("|")) {
        first_bar = true;
        auto f = make(Expr::Kind::filter, line);
        f->name = expect_name();
        while (accept_op(".")) f->name += "." + expect_name();
        f->a = std::move(e);
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = make(Expr::Kind::test, line);
        t->negate = accept_name("not");
        t->name = expect_name();
        t->a = std::move(e);
        if (is_op("(")) {
          parse_args(*t);
        } else if (takes_bare_test_arg()) {
          t->items.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), line);
      } else {
        return e;
      }
    }
  }

  // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
  bool takes_bare_test_arg() const {
    const Token& t = peek();
    if (t.kind == TokenKind::name) {
      static const char* const kStop[] = {"else", "or", "and", "if", "in", "not", "is", "recursive"};
      return std::none_of(std::begin(kStop), std::end(kStop), [&](const char* k) { return t.text == k; });
    }
    return t.kind == TokenKind::string || t.kind == TokenKind::integer || t.kind == TokenKind::floating ||
           is_op("[") || is_op("{");
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Program parse(std::string_view source, const LexOptions& options) {
  return Parser(tokenize(source, options)).run();
}

}  // namespace xpert::jinja
