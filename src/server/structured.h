// Constrained output fields of /v1/chat/completions and /v1/completions, checked into a
// CompletionRequest's GenerateParams: `response_format` (text, json_object, json_schema with its schema;
// strict or not, the schema is enforced), `grammar` (GBNF text, llama.cpp's field) and llama.cpp's
// top-level `json_schema` become GenerateParams::grammar; `logit_bias` ({"token id": bias}, -100 bans,
// 100 forces; llama.cpp's [[id, bias], ...] too) becomes SamplingParams::logit_bias. A malformed field
// or a schema the converter cannot express is an ApiError (400) naming the field.
#pragma once
#include "server/openai.h"

namespace xpert::server {

void parse_constraints(const ojson& body, CompletionRequest& r);

// 400 naming logit_bias when a token id is outside the vocabulary.
void check_logit_bias(const GenerateParams& gen, int32_t n_vocab);

}  // namespace xpert::server
