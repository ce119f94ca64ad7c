// The parsed template: expression and statement nodes. One node struct per family with a kind tag
// (the interpreter switches on it); every node keeps its source line for error messages.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "text/jinja/value.h"

namespace xpert::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,      // value
    name,         // name
    list,         // items
    tuple,        // items
    dict,         // items: key, value, key, value, ...
    attribute,    // a.name
    subscript,    // a[b]
    slice,        // a[b:c:d]; absent parts are null
    call,         // a(args)
    filter,       // a | name(args)
    test,         // a is [not] name(args); `negate`
    unary,        // op a: "not", "-", "+"
    binary,       // a op b: and or + - * / // % ** ~ == != < <= > >= in "not in"
    conditional,  // b if a else c (c may be null)
  };
  Kind kind = Kind::literal;
  int line = 0;
  Value value;
  std::string name;  // variable, attribute, filter, test or operator
  bool negate = false;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;                             // positional arguments or elements
  std::vector<std::pair<std::string, ExprPtr>> keywords;  // keyword arguments
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    text,          // text
    output,        // {{ expr }}
    if_chain,      // conditions[i] -> bodies[i]; else_body
    for_loop,      // for targets in expr [if cond] body [else else_body]
    set,           // set targets = expr, or set target.attr = expr (attr non-empty)
    set_block,     // set targets[0] [| filters] body endset
    macro,         // macro name(params=defaults) body
    call_block,    // call(params) macro(args) body endcall
    filter_block,  // filter name(args) body endfilter; `expr` is the filter applied to a placeholder
    do_expr,       // do expr
    brk,           // break
    cont,          // continue
    generation,    // HF's {% generation %} body {% endgeneration %}: renders its body
  };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;
  ExprPtr expr;                      // output / iterable / value / filter / call expression
  ExprPtr cond;                      // for-loop filter
  std::vector<std::string> targets;  // loop variables, set names, macro parameter names
  std::string attr;                  // set ns.attr
  std::vector<ExprPtr> defaults;     // macro parameter defaults (null where none)
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body, else_body;
};

// The variable that holds a block's rendered body while its filters run; not a valid identifier.
inline constexpr const char* kBlockBody = " body";

struct Program {
  Body body;
};

}  // namespace xpert::jinja
