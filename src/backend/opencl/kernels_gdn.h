// OpenCL C of the whole-model backend's Gated DeltaNet mixer (backend/gated_delta_net.h has the math and
// the CPU reference): causal conv1d + SiLU, per-head L2 norms of q and k, the decay and beta gates, the delta
// rule and the gated RMS norm. Core OpenCL C 1.2.
//
// The recurrent form (decode, short prompts) is one launch a layer, one work-group per value head: the group
// computes its own head's inputs (conv, norms, gates), then its work-items split the head's state
// S [head_k_dim][head_v_dim] by columns and by row slices, each holding its share in registers for a token
// (the state buffer is read and written once a token, coalesced across the work-group); q_t and k_t of the
// step sit in local memory.
//
// The chunked form (prefill; the algorithm of delta_rule_chunked on the CPU and gdn_chunked.cu on CUDA,
// chunks of GDN_C = 64 tokens) takes its inputs from gdn_prep, then two kernels and the norm.
// delta_chunk_prep, a work-group per (chunk, value head), does everything that does not need the state, for
// all chunks at once: the decayed K K^T (A) and Q K^T (QK), T = (I - A)^-1 by forward substitution in local
// memory, u = T (beta v), w = T (beta e^G k), and, since v_new = u - w S makes o = e^G q S + QK v_new = (e^G
// q - QK w) S + QK u, also q' = e^G q - QK w and QK u: the scan then needs no Q K^T of its own.
// delta_chunk_scan, per (value head, block of state columns; the state is column-separable), runs the chunks
// in order with its block of S in local memory: v_new = u - w S and o = scale (q' S + QK u), then S =
// e^G_last S + sum_i (k_i e^(G_last - G_i)) v_new_i, each a product of the chunk with the state at its start,
// spread over all the group's work-items. The workspace (global) holds per (chunk, head) block: G [64], QK
// [64][64], u [64][dv], w [64][dk], q' [64][dk], QK u [64][dv].
#pragma once
#include <string_view>

namespace xpert::opencl {

inline constexpr std::string_view kGdnSource = R"CLC(
#define GDN_MAXDK 512
#define GDN_MAXWG 1024  // the recurrent kernel's work-group at most
#define GDN_NR 16       // state rows a work-item of the recurrent kernel holds
#define GDN_SR 8        // state rows a work-item of the chunk scan updates
#define GDN_SCAN_CB 32  // the chunk scan's column block at most
#define GDN_SCAN_S 4096 // its block of the state in local memory (dk x columns), floats at most

// The causal conv1d + SiLU of channel c for token t: the window's rows before the prompt from the state
// (rows of `channels`), the others from x.
float conv_silu(global const float* x, global const float* state, global const float* w, int channels,
                int d_conv, int t, int c) {
  const int ns = d_conv - 1;
  float s = 0.0f;
  for (int j = 0; j < d_conv; ++j) {
    const int r = t + j;
    const float v = r < ns ? state[(long)r * channels + c] : x[(long)(r - ns) * channels + c];
    s += v * w[(long)c * d_conv + j];
  }
  return silu_f(s);
}

// Channel c's state after the prompt of n_tokens: the last d_conv - 1 rows of its window.
void conv_shift(global const float* x, global float* state, int channels, int d_conv, int n_tokens, int c) {
  const int ns = d_conv - 1;
  for (int r = 0; r < ns; ++r) {
    const int src = n_tokens + r;  // window row
    state[(long)r * channels + c] =
        src < ns ? state[(long)src * channels + c] : x[(long)(src - ns) * channels + c];
  }
}

// The chunked form's inputs in one launch: the causal conv1d + SiLU of every channel over every token (the
// state keeps the last d_conv-1 rows of the window), the L2 norm of each token's q and k heads, and the
// gates g = softplus(alpha + dt_bias) * a (log decay), beta = sigmoid(beta) per (token, value head). Group
// (gr, tb) takes the tokens of block tb (block_tokens each) and: for gr < 2 * n_k_heads, q/k head gr
// (channels gr * dk, + dk), normalized as it goes; for the others, RED_WG v channels each, and group
// 2 * n_k_heads the block's gates too.
// Only the first block reads the state (block_tokens >= d_conv - 1 or all the tokens, so no later window
// reaches it), and it alone then shifts the state (per channel, by the work-item that read it: in place is
// safe). Every group takes the norm's barriers.
kernel void gdn_prep(global const float* x, int n_tokens, int block_tokens, int channels,
                     global const float* w, int d_conv, global float* state, global float* out, int dk,
                     int n_k_heads, float eps, global const float* alpha, global const float* beta_in,
                     global const float* dt_bias, global const float* a, int n_v_heads, global float* g,
                     global float* beta) {
  local float buf[RED_WG];
  const int gr = get_group_id(0), tb = get_group_id(1), lid = get_local_id(0), qk = gr < 2 * n_k_heads;
  const int c0 = qk ? gr * dk : 2 * n_k_heads * dk + (gr - 2 * n_k_heads) * RED_WG;
  const int c1 = qk ? c0 + dk : min(c0 + RED_WG, channels);
  const int t0 = tb * block_tokens, t1 = min(t0 + block_tokens, n_tokens);
  for (int t = t0; t < t1; ++t) {
    float ss = 0.0f;
    for (int c = c0 + lid; c < c1; c += RED_WG) {
      const float y = conv_silu(x, state, w, channels, d_conv, t, c);
      out[(long)t * channels + c] = y;
      ss += y * y;
    }
    ss = wg_sum(ss, buf);
    const float inv = 1.0f / sqrt(ss + eps);
    if (qk)
      for (int c = c0 + lid; c < c1; c += RED_WG) out[(long)t * channels + c] *= inv;
  }
  for (int c = c0 + lid; tb == 0 && c < c1; c += RED_WG) conv_shift(x, state, channels, d_conv, n_tokens, c);
  if (gr == 2 * n_k_heads)
    for (long i = (long)t0 * n_v_heads + lid; i < (long)t1 * n_v_heads; i += RED_WG) {
      const int h = i % n_v_heads;
      const float xa = alpha[i] + dt_bias[h];
      const float sp = xa > 20.0f ? xa : log(1.0f + exp(xa));
      g[i] = sp * a[h];
      beta[i] = sigmoid_f(beta_in[i]);
    }
}

// The sums of a and b over the group's wg work-items (any wg), in a[0] and b[0].
void group_sum2(local float* a, local float* b, int lid, int wg) {
  int s = 1;
  while (2 * s < wg) s *= 2;
  for (; s > 0; s >>= 1) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < s && lid + s < wg) {
      a[lid] += a[lid + s];
      b[lid] += b[lid + s];
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}

// A layer's decode (or short prompt) in one launch: work-group h (value head) takes the layer's inputs for
// its head itself, as gdn_prep does for all (the causal conv1d + SiLU of its key head's q and k channels,
// their L2 norms, of its v channels; its gates g and beta), then the delta rule and the gated RMS norm.
// The state: C x R work-items, work-item (jl = lid % C, r = lid / C) holds rows r, r + R, ... (GDN_NR at
// most: R * GDN_NR >= dk) of state columns jl, jl + C, ... in turn, in registers: one pass over the state a
// token, every load of a work-item in flight at once (a work-item walking a whole column waited a trip to
// memory per row: ~59 us a layer on an H200). S k and the output q S are summed over the R row slices in
// local memory. Each token's output of the head then takes the gated RMS norm (the sum of squares by a tree
// over the group): out = rmsnorm(out) * norm_w * silu(z).
// The convolution's state: a group shifts its v channels after the prompt; the q and k channels are shared by
// the value heads of one key head (h % n_k_heads), so the last of them to finish (last_group on
// conv_counters[kh]) shifts those, after every one of them has read the old rows.
kernel void delta_rule_recurrent(global const float* x, int channels, global const float* conv_w,
                                 int d_conv, global float* conv_state, global const float* alpha,
                                 global const float* beta_in, global const float* dt_bias,
                                 global const float* a, global float* state, global float* out, int n_tokens,
                                 int n_k_heads, int n_v_heads, int dk, int dv, global const float* norm_w,
                                 global const float* z, float eps, int R, int out_mode, global float* outq,
                                 volatile global int* counters, volatile global int* conv_counters) {
  local float qs[GDN_MAXDK], ks[GDN_MAXDK], ra[GDN_MAXWG], rb[GDN_MAXWG];
  local int ri[GDN_MAXWG], flag;
  const int h = get_group_id(0), kh = h % n_k_heads, lid = get_local_id(0), wg = get_local_size(0);
  const int C = wg / R, jl = lid % C, r = lid / C, key_dim = n_k_heads * dk;
  const int v0 = 2 * key_dim + h * dv;  // the head's first v channel
  global float* S = state + (long)h * dk * dv;
  const float scale = 1.0f / sqrt((float)dk);
  for (int t = 0; t < n_tokens; ++t) {
    // q and k of the key head: channel kh dk + i of q (i < dk) and of k (key_dim + ...), normalized.
    float sq = 0.0f, sk = 0.0f;
    for (int i = lid; i < 2 * dk; i += wg) {
      const int iq = i < dk ? i : i - dk;
      const int c = (i < dk ? 0 : key_dim) + kh * dk + iq;
      const float y = conv_silu(x, conv_state, conv_w, channels, d_conv, t, c);
      if (i < dk) {
        qs[iq] = y;
        sq += y * y;
      } else {
        ks[iq] = y;
        sk += y * y;
      }
    }
    ra[lid] = sq;
    rb[lid] = sk;
    group_sum2(ra, rb, lid, wg);
    const float inq = 1.0f / sqrt(ra[0] + eps), ink = 1.0f / sqrt(rb[0] + eps);
    for (int i = lid; i < 2 * dk; i += wg) {
      if (i < dk) qs[i] *= inq;
      else ks[i - dk] *= ink;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // The gates, as gdn_prep computes them.
    const long th = (long)t * n_v_heads + h;
    const float xa = alpha[th] + dt_bias[h];
    const float decay = exp((xa > 20.0f ? xa : log(1.0f + exp(xa))) * a[h]), b = sigmoid_f(beta_in[th]);
    global float* o_t = out + ((long)t * n_v_heads + h) * dv;
    float ss = 0.0f;
    for (int j0 = 0; j0 < dv; j0 += C) {
      const int j = j0 + jl;
      const bool on = j < dv;
      const float vj = on ? conv_silu(x, conv_state, conv_w, channels, d_conv, t, v0 + j) : 0.0f;
      float s[GDN_NR];
#pragma unroll
      for (int u = 0; u < GDN_NR; ++u) {  // every load first, then the sums
        const int i = r + u * R;
        s[u] = on && i < dk ? S[(long)i * dv + j] : 0.0f;
      }
      float part = 0.0f;
#pragma unroll
      for (int u = 0; u < GDN_NR; ++u) {
        const int i = r + u * R;
        s[u] *= decay;
        part += i < dk ? ks[i] * s[u] : 0.0f;
      }
      ra[lid] = part;
      barrier(CLK_LOCAL_MEM_FENCE);
      float delta = 0.0f;
      for (int p = 0; p < R; ++p) delta += ra[p * C + jl];
      delta = on ? (vj - delta) * b : 0.0f;
      float po = 0.0f;
#pragma unroll
      for (int u = 0; u < GDN_NR; ++u) {
        const int i = r + u * R;
        if (on && i < dk) {
          s[u] += ks[i] * delta;
          S[(long)i * dv + j] = s[u];
          po += qs[i] * s[u];
        }
      }
      rb[lid] = po;
      barrier(CLK_LOCAL_MEM_FENCE);
      if (on && r == 0) {
        float o = 0.0f;
        for (int p = 0; p < R; ++p) o += rb[p * C + jl];
        o *= scale;
        o_t[j] = o;
        ss += o * o;
      }
    }
    // The gated norm of the token's head: the sum of squares by a tree over the C work-items that hold one
    // (r == 0: the first C), then each of them its own columns (its own writes).
    if (r == 0) ra[lid] = ss;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int sh = GDN_MAXWG / 2; sh > 0; sh >>= 1) {
      if (sh < C && lid < sh && lid + sh < C) ra[lid] += ra[lid + sh];
      barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / sqrt(ra[0] / (float)dv + eps);
    global const float* z_t = z + ((long)t * n_v_heads + h) * dv;
    global float* q_t = outq + ((long)t * n_v_heads + h) * dv;
    if (r == 0)
      for (int j = jl; j < dv; j += C) {
        const float y = (o_t[j] * inv) * norm_w[j] * silu_f(z_t[j]);
        o_t[j] = y;
        if (out_mode >= 2) q_t[j] = round_elem(y, out_mode);
      }
    barrier(CLK_LOCAL_MEM_FENCE);
    // out_mode 0, 1: the output rounded for the projection in blocks, by the last group of the heads a
    // block spans.
    if (out_mode == 0 || out_mode == 1)
      round_head_blocks(out, outq, t, h, n_v_heads, dv, out_mode, wg, counters, &flag, ra, ri);
  }
  // The convolution's state after the prompt, once every work-item's reads of the old rows are done.
  barrier(CLK_GLOBAL_MEM_FENCE);
  for (int j = lid; j < dv; j += wg) conv_shift(x, conv_state, channels, d_conv, n_tokens, v0 + j);
  const int siblings = (n_v_heads - kh + n_k_heads - 1) / n_k_heads;  // value heads h' = kh (mod n_k_heads)
  if (last_group(conv_counters + kh, siblings, &flag))
    for (int i = lid; i < 2 * dk; i += wg) {
      const int c = (i < dk ? 0 : key_dim) + kh * dk + (i < dk ? i : i - dk);
      conv_shift(x, conv_state, channels, d_conv, n_tokens, c);
    }
}

#define GDN_C 64
#define GDN_P (GDN_C + 1)  // row pitch of A in local memory
#define GDN_PREP_WG 256    // delta_chunk_prep's work-group where the device allows it
#define GDN_KT 32          // dims of the chunk's k and q in local memory at a time (the scores)
#define GDN_PB 9           // score pairs a work-item holds (2,080 of a whole chunk in one pass of 256)

// Work-group (chunk c, value head h) of wg >= GDN_C work-items (the host takes GDN_PREP_WG where it can:
// more work-items a group, each with less to walk). Rows past the chunk's L tokens are never read. Every sum
// runs in the order of the CPU's.
kernel void delta_chunk_prep(global const float* q, global const float* k, global const float* v, long qk_stride,
                             long v_stride, global const float* g, global const float* beta, int n_tokens,
                             int n_k_heads, int n_v_heads, int dk, int dv, global float* ws_g, global float* ws_qk,
                             global float* ws_u, global float* ws_w, global float* ws_qp, global float* ws_qku) {
  local float A[GDN_C * GDN_P], Kt[GDN_KT * GDN_P], Qt[GDN_KT * GDN_P];
  local float G[GDN_C], B[GDN_C], eG[GDN_C], old[GDN_C];
  const int c = get_group_id(0), h = get_group_id(1), kh = h % n_k_heads, lid = get_local_id(0);
  const int wg = get_local_size(0);
  const long t0 = (long)c * GDN_C;
  const int L = (int)min((long)GDN_C, (long)n_tokens - t0);
  const long base = (long)c * n_v_heads + h;
  global const float* qc = q + t0 * qk_stride + (long)kh * dk;
  global const float* kc = k + t0 * qk_stride + (long)kh * dk;
  global const float* vc = v + t0 * v_stride + (long)h * dv;
  global float* QK = ws_qk + base * GDN_C * GDN_C;
  global float* U = ws_u + base * GDN_C * dv;
  global float* W = ws_w + base * GDN_C * dk;
  global float* QP = ws_qp + base * GDN_C * dk;
  global float* QKU = ws_qku + base * GDN_C * dv;

  if (lid < GDN_C) {
    G[lid] = lid < L ? g[(t0 + lid) * n_v_heads + h] : 0.0f;
    B[lid] = lid < L ? beta[(t0 + lid) * n_v_heads + h] : 0.0f;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid == 0) {  // cumulative log decay, in order as the CPU sums it
    float cum = 0.0f;
    for (int i = 0; i < GDN_C; ++i) G[i] = cum += G[i];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid < GDN_C) {
    ws_g[base * GDN_C + lid] = G[lid];
    eG[lid] = exp(G[lid]);
  }

  // A (strictly lower) and the decayed q.k scores (lower with the diagonal), a work-item per pair (i, j <= i)
  // of the triangle (pair p = i (i + 1) / 2 + j), GDN_PB pairs at a time. The chunk's k and q pass through
  // local memory GDN_KT dims at a time, dim-major: a warp's pairs read one row i (a broadcast) and
  // consecutive rows j (consecutive banks), where reading them from global memory touched a cache line per
  // row. Each sum still runs over the dims in order.
  const int np = L * (L + 1) / 2;
  for (int p0 = 0; p0 < np; p0 += GDN_PB * wg) {
    int pi[GDN_PB], pj[GDN_PB];
    float kk[GDN_PB], qk[GDN_PB];
#pragma unroll
    for (int b = 0; b < GDN_PB; ++b) {
      const int p = min(p0 + b * wg + lid, np - 1);  // past the triangle: the last pair again, not stored
      int i = (int)((sqrt(8.0f * (float)p + 1.0f) - 1.0f) * 0.5f);
      while (i * (i + 1) / 2 > p) --i;
      while ((i + 1) * (i + 2) / 2 <= p) ++i;
      pi[b] = i, pj[b] = p - i * (i + 1) / 2, kk[b] = 0.0f, qk[b] = 0.0f;
    }
    for (int d0 = 0; d0 < dk; d0 += GDN_KT) {
      const int nd = min(GDN_KT, dk - d0);
      barrier(CLK_LOCAL_MEM_FENCE);  // the previous dims read
      for (int e = lid; e < L * GDN_KT; e += wg) {  // consecutive work-items: consecutive dims of a row
        const int t = e / GDN_KT, d = e % GDN_KT;
        Kt[d * GDN_P + t] = d < nd ? kc[t * qk_stride + d0 + d] : 0.0f;
        Qt[d * GDN_P + t] = d < nd ? qc[t * qk_stride + d0 + d] : 0.0f;
      }
      barrier(CLK_LOCAL_MEM_FENCE);
      for (int d = 0; d < nd; ++d)
#pragma unroll
        for (int b = 0; b < GDN_PB; ++b) {
          const float kj = Kt[d * GDN_P + pj[b]];
          kk[b] += Kt[d * GDN_P + pi[b]] * kj;
          qk[b] += Qt[d * GDN_P + pi[b]] * kj;
        }
    }
#pragma unroll
    for (int b = 0; b < GDN_PB; ++b) {
      const int i = pi[b], j = pj[b];
      if (p0 + b * wg + lid >= np) continue;
      const float e = exp(G[i] - G[j]);
      A[i * GDN_P + j] = j < i ? -B[i] * kk[b] * e : 0.0f;
      QK[i * GDN_C + j] = qk[b] * e;
    }
  }
  // T - I in A by forward substitution, row by row (rows m < i final):
  // T[i][j] = A[i][j] + sum_{j<m<i} A[i][m] T[m][j], the sum in increasing m as on the CPU.
  for (int i = 1; i < L; ++i) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < i) old[lid] = A[i * GDN_P + lid];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < i) {
      float acc = old[lid];
      for (int m = lid + 1; m < i; ++m) acc += old[m] * A[m * GDN_P + lid];
      A[i * GDN_P + lid] = acc;
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);

  // A column of u = T (B v) (d < dv) or of w = T (B e^G k) per work-item, T = A + I.
  for (int d = lid; d < dv + dk; d += wg)
    for (int i = 0; i < L; ++i) {
      float acc = 0.0f;
      if (d < dv) {
        for (int j = 0; j <= i; ++j)
          acc += ((j == i ? 1.0f : A[i * GDN_P + j]) * B[j]) * vc[j * v_stride + d];
        U[i * dv + d] = acc;
      } else {
        for (int j = 0; j <= i; ++j)
          acc += (((j == i ? 1.0f : A[i * GDN_P + j]) * B[j]) * eG[j]) * kc[j * qk_stride + d - dv];
        W[i * dk + d - dv] = acc;
      }
    }
  // QK into A (T is no longer needed); the barrier publishes the global writes of u, w and QK.
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  for (int p = lid; p < L * GDN_C; p += wg)
    if (p % GDN_C <= p / GDN_C) A[p / GDN_C * GDN_P + p % GDN_C] = QK[p];
  barrier(CLK_LOCAL_MEM_FENCE);
  // A column of q' = e^G q - QK w (d < dk) or of QK u per work-item.
  for (int d = lid; d < dk + dv; d += wg)
    for (int i = 0; i < L; ++i) {
      float acc = 0.0f;
      if (d < dk) {
        for (int m = 0; m <= i; ++m) acc += A[i * GDN_P + m] * W[m * dk + d];
        QP[i * dk + d] = qc[i * qk_stride + d] * eG[i] - acc;
      } else {
        for (int m = 0; m <= i; ++m) acc += A[i * GDN_P + m] * U[m * dv + d - dk];
        QKU[i * dv + d - dk] = acc;
      }
    }
}

// Work-group (column block, value head h) of CB x R work-items: work-item (jl, sl) has state column j = the
// block's first + jl and row slice sl (rows sl * GDN_SR, + GDN_SR; R = ceil(dk / GDN_SR)). The block of the
// state (dk x CB) stays in local memory for the whole prompt. A chunk needs only the state at its start, so
// its two steps are products of the chunk with that block: (1) v_new = u - w S and o = scale (q' S + QK u),
// work-item (jl, sl) for tokens sl, sl + R, ... two at a time (one read of S for both), v_new into local
// memory; (2) S = e^G_last S + sum_i (k_i e^(G_last - G_i)) v_new_i, the slice's rows in registers. Each sum
// runs in the order of the CPU's.
kernel void delta_chunk_scan(global const float* k, long qk_stride, global float* state, global float* out,
                             int n_tokens, int n_k_heads, int n_v_heads, int dk, int dv, global const float* ws_g,
                             global const float* ws_u, global const float* ws_w, global const float* ws_qp,
                             global const float* ws_qku) {
  local float Sl[GDN_SCAN_S], VN[GDN_C * GDN_SCAN_CB], G[GDN_C], ed[GDN_C];
  const int h = get_group_id(2), kh = h % n_k_heads;
  const int jl = get_local_id(0), CB = get_local_size(0), sl = get_local_id(1), R = get_local_size(1);
  const int lin = sl * CB + jl, wg = CB * R, j = get_group_id(0) * CB + jl, r0 = sl * GDN_SR;
  const int nr = min(GDN_SR, dk - r0);
  const bool col = j < dv;
  global float* S = state + (long)h * dk * dv;
  const float scale = 1.0f / sqrt((float)dk);
  for (int r = sl; r < dk; r += R) Sl[r * CB + jl] = col ? S[(long)r * dv + j] : 0.0f;
  const long n_chunks = ((long)n_tokens + GDN_C - 1) / GDN_C;
  for (long c = 0; c < n_chunks; ++c) {
    const long t0 = c * GDN_C, base = c * n_v_heads + h;
    const int L = (int)min((long)GDN_C, (long)n_tokens - t0);
    barrier(CLK_LOCAL_MEM_FENCE);  // the block of S whole; the last chunk's G and ed read
    for (int i = lin; i < GDN_C; i += wg) G[i] = ws_g[base * GDN_C + i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = lin; i < L; i += wg) ed[i] = exp(G[L - 1] - G[i]);
    global const float* U = ws_u + base * GDN_C * dv;
    global const float* W = ws_w + base * GDN_C * dk;
    global const float* QP = ws_qp + base * GDN_C * dk;
    global const float* QKU = ws_qku + base * GDN_C * dv;
    for (int i = sl; col && i < L; i += 2 * R) {
      const int i2 = i + R < L ? i + R : i;  // the pair's second token (the first again past the chunk)
      global const float *w0 = W + i * dk, *w1 = W + i2 * dk, *q0 = QP + i * dk, *q1 = QP + i2 * dk;
      float vn0 = U[i * dv + j], vn1 = U[i2 * dv + j], o0 = 0.0f, o1 = 0.0f;
      for (int r = 0; r < dk; ++r) {
        const float s = Sl[r * CB + jl];
        vn0 -= w0[r] * s;
        o0 += q0[r] * s;
        vn1 -= w1[r] * s;
        o1 += q1[r] * s;
      }
      VN[i * CB + jl] = vn0;
      out[((t0 + i) * n_v_heads + h) * dv + j] = (o0 + QKU[i * dv + j]) * scale;
      VN[i2 * CB + jl] = vn1;
      out[((t0 + i2) * n_v_heads + h) * dv + j] = (o1 + QKU[i2 * dv + j]) * scale;
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // v_new and ed whole; every read of the chunk's S done
    if (!col) continue;
    const float e_last = exp(G[L - 1]);
    float acc[GDN_SR];
    for (int rr = 0; rr < GDN_SR; ++rr) acc[rr] = rr < nr ? Sl[(r0 + rr) * CB + jl] * e_last : 0.0f;
    global const float* kc = k + t0 * qk_stride + (long)kh * dk + r0;
    for (int i = 0; i < L; ++i) {
      const float v = VN[i * CB + jl], e = ed[i];
      global const float* ki = kc + i * qk_stride;
      for (int rr = 0; rr < GDN_SR; ++rr)
        if (rr < nr) acc[rr] += (ki[rr] * e) * v;
    }
    for (int rr = 0; rr < GDN_SR; ++rr)
      if (rr < nr) Sl[(r0 + rr) * CB + jl] = acc[rr];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int r = sl; col && r < dk; r += R) S[(long)r * dv + j] = Sl[r * CB + jl];
}

// Per row of n (one value head of one token): out = rmsnorm(out) * w * silu(z), in place.
kernel void gated_rmsnorm(global float* out, global const float* w, global const float* z, int n, float eps) {
  local float buf[RED_WG];
  const long r = get_group_id(0);
  global float* o = out + r * n;
  global const float* zr = z + r * n;
  float s = 0.0f;
  for (int i = get_local_id(0); i < n; i += RED_WG) s += o[i] * o[i];
  s = wg_sum(s, buf);
  const float inv = 1.0f / sqrt(s / (float)n + eps);
  for (int i = get_local_id(0); i < n; i += RED_WG) o[i] = (o[i] * inv) * w[i] * silu_f(zr[i]);
}
)CLC";

}  // namespace xpert::opencl
