// FuseAttention: scaled dot-product attention as exporters and the API-built blocks write it,
// rewritten into one FusedAttention node (kernel: src/cpu/kernels/attention.cc).
//
//   %q4 = Transpose(Reshape(%q, [B,S,H,d]), perm [0,2,1,3])      (k4, v4 alike; q4/k4 maybe Rope'd)
//   %kt = Transpose(%k4, perm [0,1,3,2])                          (or Transpose(Reshape(k), [0,2,3,1]))
//   %s  = MatMul(%q4, %kt)                                        ==>   %o = FusedAttention(%q, %k, %v
//   %s1 = Div(%s, c) / Mul(%s, c) ...        (scalar constants)               [, %mask] [, %cos, %sin])
//         [Mul(Tanh(%s1), c)]                 (logit soft-capping, before the masks)
//   %s2 = Add(%s1, %mask)                    (broadcast to [B,H,S,Sk])       {reference = graph {...}}
//         and / or Where(%bool_mask, %s1, c) / Where(%bool_mask, c, %s1), in either order (c a
//            scalar constant, e.g. -inf; Not / Cast-to-bool of the mask that nothing else reads
//            come inside, as a flip)
//   %p  = Softmax(%s2, axis -1)
//   %p1 = Where(IsNaN(%p), 0, %p)           (optional: the exporters' and SDPA's guard, which turns
//                                             a row masked everywhere into zeros, not NaN)
//   %o4 = MatMul(%p1, %v4)
//   %o  = Reshape(Transpose(%o4, perm [0,2,1,3]), [B,S,H*d])      (optional)
//
// Note on the algorithm. Each Softmax over the last axis anchors a match: its input chain is
// walked back through scalar Mul/Div, at most one mask Add and at most one Where (which keeps the
// scores where a bool mask says and puts a scalar elsewhere) to the Q K^T MatMul, and its
// output must feed the P V MatMul. That "core" (scores, scaled / masked scores, probabilities)
// is all-or-nothing: an intermediate read outside the pattern or returned by the graph refuses
// the fusion, since computing it a second time would cost as much as the attention itself.
// Operands are absorbed greedily and safely: Q, K and V are followed back through Rope,
// Transpose and Reshape only while each value is read by the pattern alone; where the walk
// stops, the value reached is read in place through a layout the kernel knows (bshd: the
// pre-head-split tensor; bhsd: a head-split tensor; bhds: K already transposed). So a K that
// is also kept as a cache output, or a RoPE that is still written out as Slice/Neg/Concat, only
// shortens the chain; it never blocks the fusion and never computes anything twice. The
// output side likewise takes Transpose(perm [0,2,1,3]) and a Reshape when nothing else reads
// what they consume, and then writes [B,S,H*dv] order directly.
//
// The same holds for heads that merge batch and head dims, as torch's bmm-based attention
// (nn.MultiheadAttention) writes them: Q [N,S,d], K^T [N,d,Sk], V [N,Sk,dv] with N = B*H, the
// head split being Transpose(perm [1,0,2]) of [S,N,d] (K^T: perm [1,2,0]). The node runs them as
// B = 1 and H = N, which addresses the same elements: head n of [S,N,d] starts at n*d and its
// rows are N*d apart, the bshd layout of one batch. A scalar Mul / Div of Q or K read only by
// the pattern (nn.MultiheadAttention scales q by 1/sqrt(d) before the scores) joins the scale.
//
// Grouped-query attention: when K and V both come from transformers' repeat_kv (Unsqueeze,
// Expand, Reshape of [B,KV,T,d] to [B,KV*R,T,d]) with the same KV, the node reads the KV heads
// themselves (kv_heads = KV; query head h reads K / V head h / R) and the repeat is absorbed.
//
// Nothing the fused node reads can depend on an absorbed value (each is read only inside the
// pattern), so the rewrite cannot create a cycle.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/prepared_store.h"
#include "core/hash.h"
#include "ir/op_registry.h"
#include "ir/text.h"
#include "ir/schemas/attention_layout.h"
#include "ir/schemas/fused_gemm.h"
#include "passes/fusion_legality.h"
#include "passes/fusion_passes.h"
#include "passes/pass_manager.h"
#include "passes/match.h"
#include "passes/reference_graph.h"

namespace graphfuse {
namespace {

// Stable refusal codes of this pass (the --json contract: never renamed, only added to).
constexpr const char* kIntermediateEscapes = "attention-intermediate-escapes";  // scores/probs read elsewhere
constexpr const char* kUnsupportedLayout = refusal::kAttentionUnsupportedLayout;
constexpr const char* kUnsupportedDtype = "attention-unsupported-dtype";        // a dtype the kernel does not take
constexpr const char* kUnsupportedPattern = "attention-unsupported-pattern";    // an op between QK^T and softmax

using match::BroadcastsTo;
using match::ProducerOf;
using match::ScalarConstant;
using match::SingleUse;
using match::SingleUseProducer;

// One of Q, K, V as the fused node reads it.
struct Operand {
  Value* input = nullptr;
  std::string layout = "bhsd";
  Node* rope = nullptr;
  bool rope_bshd = false;  // the Rope came before the head split's Transpose ([B,S,H,d] rows)
  std::vector<Node*> nodes;  // absorbed Rope / Transpose / Reshape
};

struct Match {
  Node* softmax = nullptr;
  Node* qk = nullptr;
  Node* pv = nullptr;
  std::vector<Node*> core;  // scale, mask and softmax nodes between the MatMuls
  // The guard after the softmax, when there is one: IsNaN(p), then Where(IsNaN(p), 0, p),
  // which the P V MatMul reads.
  std::vector<Node*> guard;
  Operand q, k, v;
  Value* mask = nullptr;       // added (f32)
  Value* bool_mask = nullptr;  // selecting (Where)
  double scale = 1, mask_scale = 1, fill_scale = 1;  // all factors; those after the Add; after the Where
  // Soft-capping: scores = softcap * tanh(scale * Q K^T) before the mask (0: none); `scale`
  // then holds the factors inside the tanh only.
  double softcap = 0;
  int mask_select = 0;   // +1 / -1: the bool mask keeps scores where true / false
  bool select_first = false;  // both masks: the Where comes before the Add
  std::vector<Node*> mask_nodes;  // Not / Cast-to-bool between the bool mask and the Where
  double mask_fill = 0;  // the Where's scalar (before the factors after it, in fill_scale)
  Value* out = nullptr;
  std::string out_layout = "bhsd";
  std::vector<Node*> out_nodes;
  int64_t b = 0, h = 0, s = 0, sk = 0, d = 0, dv = 0;
  int64_t kv_h = 0;  // K / V heads read (fewer than h when K and V are repeated heads, GQA)
  // 4: the MatMuls multiply [B,H,S,d] heads; 3: [N,S,d] heads (torch's bmm over B*H, as
  // nn.MultiheadAttention writes it), run as B = 1 and H = N (the heads need not be apart).
  size_t rank = 4;
};

// The permutations of a rank-`rank` head tensor ([B,H,S,d] or [N,S,d]): swapping the head and
// row dims (head split / merge), and the two ways K^T is written: from K rows, or from the
// pre-split tensor [.., Sk, H, d] (or [Sk, N, d]).
std::vector<int64_t> HeadSwapPerm(size_t rank) {
  return rank == 4 ? std::vector<int64_t>{0, 2, 1, 3} : std::vector<int64_t>{1, 0, 2};
}
std::vector<int64_t> RowsToKtPerm(size_t rank) {
  return rank == 4 ? std::vector<int64_t>{0, 1, 3, 2} : std::vector<int64_t>{0, 2, 1};
}
std::vector<int64_t> SplitToKtPerm(size_t rank) {
  return rank == 4 ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{1, 2, 0};
}

// Seq-first heads [S,B,H,d] (nn.MultiheadAttention with batch_first=False): to [B,H,S,d], to
// K^T [B,H,d,S], and the output [B,H,S,d] back to [S,B,H,d].
const std::vector<int64_t> kSeqFirstToHeads = {1, 2, 0, 3};
const std::vector<int64_t> kSeqFirstToKt = {1, 2, 3, 0};
const std::vector<int64_t> kHeadsToSeqFirst = {2, 0, 1, 3};

// transformers' repeat_kv, as exported: x [B,KV,T,d] -> Unsqueeze(axis 2) (or Reshape) to
// [B,KV,1,T,d] -> Expand to [B,KV,R,T,d] -> Reshape to [B,KV*R,T,d], each value read by the next
// alone. Head h of the result is head h / R of x: the kernel reads x with kv_heads = KV.
struct RepeatedHeads {
  Value* x = nullptr;
  int64_t kv = 0;
  std::vector<Node*> nodes;
};

std::optional<RepeatedHeads> MatchRepeatKv(Value* v) {
  Node* r = SingleUseProducer(v, op::Reshape);
  Node* e = r ? SingleUseProducer(r->input(0), op::Expand) : nullptr;
  if (!e) return std::nullopt;
  Node* u = SingleUseProducer(e->input(0), op::Unsqueeze);
  if (!u) u = SingleUseProducer(e->input(0), op::Reshape);
  if (!u) return std::nullopt;
  Value* x = u->input(0);
  const Shape& xs = x->shape();
  const Shape& es = e->output()->shape();
  if (xs.size() != 4 || u->output()->shape() != Shape{xs[0], xs[1], 1, xs[2], xs[3]} ||
      es != Shape{xs[0], xs[1], es.size() == 5 ? es[2] : -1, xs[2], xs[3]} ||
      v->shape() != Shape{xs[0], xs[1] * es[2], xs[2], xs[3]})
    return std::nullopt;
  return RepeatedHeads{x, xs[1], {r, e, u}};
}

class AttentionFuser {
 public:
  AttentionFuser(Graph& g, const FusionOptions& o, FusionReport* report) : g_(g), o_(o), report_(report) {}

  Result<int> Run() {
    std::vector<Node*> order;
    for (const auto& n : g_.nodes()) order.push_back(n.get());
    for (size_t i = 0; i < order.size(); ++i) index_[order[i]] = static_cast<int>(i);
    int formed = 0, candidates = 0;
    for (Node* n : order) {
      if (!n->is(op::Softmax) || absorbed_.count(n)) continue;
      Match m;
      if (!MatchAt(n, &m)) continue;
      // Group names count candidates, so excluding one keeps the others' names stable.
      const std::string name = StrCat("fused_attention_", candidates++);
      if (!Allowed(m, name)) continue;
      GF_RETURN_IF_ERROR(Rewrite(m, name));
      ++formed;
    }
    if (formed == 0) return 0;
    GF_RETURN_IF_ERROR(g_.TopologicalSort());
    g_.RemoveDeadNodes();
    for (auto& [v, name] : renames_) GF_RETURN_IF_ERROR(g_.RenameValue(v, name));
    return formed;
  }

 private:
  // Q, K rows or V read back through Rope (when allowed) -> Transpose(perm 0,2,1,3) -> Reshape.
  // `x` is the head-split value [B,H,rows,cols] the MatMul reads.
  Operand MatchHeads(Value* x, bool allow_rope, int64_t rows, int64_t cols, const Operand* rope_like, size_t rank) {
    Operand op;
    op.input = x;
    Value* cur = x;
    if (Node* r = allow_rope ? SingleUseProducer(cur, op::Rope) : nullptr; r && RopeFits(*r, rows, cols, rope_like)) {
      op.rope = r;
      op.nodes.push_back(r);
      cur = r->input(0);
      op.input = cur;
    }
    Node* t = SingleUseProducer(cur, op::Transpose);
    const bool seq_first = t && rank == 4 && t->GetInts("perm") == kSeqFirstToHeads;
    if (t && (t->GetInts("perm") == HeadSwapPerm(rank) || seq_first)) {
      op.nodes.push_back(t);
      op.input = t->input(0);  // [B,rows,H,cols] (or [rows,N,cols]): the bshd layout already
      op.layout = seq_first ? "sbhd" : "bshd";
      // RoPE applied before the head split (GPT-J rotates [B,S,H,d] rows): its tables
      // broadcast over [B,S,H,r].
      if (Node* r = allow_rope && !op.rope && !seq_first ? SingleUseProducer(op.input, op::Rope) : nullptr;
          r && RopeFits(*r, rows, cols, rope_like, /*bshd=*/true)) {
        op.rope = r;
        op.rope_bshd = true;
        op.nodes.push_back(r);
        op.input = r->input(0);
      }
      if (Node* r = SingleUseProducer(op.input, op::Reshape)) {
        op.nodes.push_back(r);
        op.input = r->input(0);
      }
    }
    return op;
  }

  // A Rope the kernel applies: (x, cos, sin), no attribute it would not honour, cos/sin f32
  // [.., rows, r] broadcasting over the heads (r: rotary_dim, the head dim by default), and the
  // same tables (and r) as Q's when both rotate.
  bool RopeFits(const Node& r, int64_t rows, int64_t cols, const Operand* rope_like, bool bshd = false) {
    if (r.inputs().size() != 3 || cols % 2 != 0) return false;
    // Provenance, the rotated width and the pairing are the attributes the kernel honours.
    for (const auto& [key, value] : r.attrs())
      if (key != "canonicalized_from" && key != "rotary_dim" && key != "interleaved") return false;
    if (rope_like && rope_like->rope &&
        (rope_like->rope_bshd != bshd || rope_like->rope->GetInt("interleaved", 0) != r.GetInt("interleaved", 0)))
      return false;
    const int64_t rot = r.GetInt("rotary_dim", 0) > 0 ? r.GetInt("rotary_dim", 0) : cols;
    if (rope_like && rope_like->rope &&
        rot != (rope_like->rope->GetInt("rotary_dim", 0) > 0 ? rope_like->rope->GetInt("rotary_dim", 0) : cols))
      return false;
    const Value* x = r.input(0);
    const Value* c = r.input(1);
    const Value* s = r.input(2);
    if (!x || !c || !s || c->shape() != s->shape() || c->dtype() != x->dtype() || s->dtype() != x->dtype() ||
        !RowKernelTakes(x->dtype(), o_))
      return false;
    if (c->shape().empty() || c->shape().back() != rot || x->shape().size() != 4) return false;
    const Shape rows_of = bshd ? Shape{x->shape()[0], rows, x->shape()[2], rot} : Shape{x->shape()[0], x->shape()[1], rows, rot};
    if (!BroadcastsTo(c->shape(), rows_of)) return false;
    if (rope_like && rope_like->rope &&
        (!match::SameData(rope_like->rope->input(1), c) || !match::SameData(rope_like->rope->input(2), s)))
      return false;
    return true;
  }

  bool MatchAt(Node* sm, Match* m) {
    m->softmax = sm;
    // The P V MatMul: the first reader of the probabilities (or of their NaN guard) that
    // multiplies them from the left.
    Value* p = sm->output();
    MatchNanGuard(p, m);
    if (!m->guard.empty()) p = m->guard.back()->output();
    for (const Use& u : p->uses())
      if (u.node->is(op::MatMul) && u.input_index == 0) m->pv = u.node;
    if (!m->pv) {
      // Probabilities reshaped before the P V MatMul (BLOOM's baddbmm / bmm over [B*H,S,T]
      // around a [B,H,S,T] softmax): said, not matched.
      for (const Use& u : p->uses())
        if (u.node->is(op::Reshape) && u.node->output())
          for (const Use& w : u.node->output()->uses())
            if (w.node->is(op::MatMul) && w.input_index == 0)
              Refuse(report_, sm, w.node->name(), kUnsupportedLayout,
                     StrCat("softmax '", sm->name(), "' ", p->TypeString(), " reaches MatMul '", w.node->name(),
                            "' through a Reshape to ", u.node->output()->TypeString(),
                            ": scores reshaped between the MatMuls are not matched"));
      return false;
    }
    // Walk back from the softmax input: scalar scales, at most one mask Add and one Where.
    m->core.push_back(sm);
    Value* cur = sm->input(0);
    bool add_seen = false, select_seen = false, tanh_seen = false;
    double since_mask = 1;  // the factors met since the last mask op (after it in graph order)
    // Whether v is the scores' side of a mask op: a MatMul reached back through the ops this
    // walk takes (a few steps; the mask side is a graph input, a constant, or other ops).
    std::function<bool(const Value*, int)> scores_like = [&](const Value* v, int depth) {
      const Node* pr = v->producer();
      if (!pr || depth > 6) return false;
      if (pr->is(op::MatMul)) return true;
      if (pr->is(op::Mul) || pr->is(op::Div) || pr->is(op::Add))
        return scores_like(pr->input(0), depth + 1) || scores_like(pr->input(1), depth + 1);
      if (pr->is(op::Where)) return scores_like(pr->input(1), depth + 1) || scores_like(pr->input(2), depth + 1);
      if (pr->is(op::Tanh)) return scores_like(pr->input(0), depth + 1);
      return false;
    };
    for (;;) {
      Node* n = cur->producer();
      if (!n || n->is(op::MatMul)) break;
      double c = 0;
      Value* next = nullptr;
      if (n->is(op::Mul)) {
        for (auto [x, k] : match::OperandOrders(*n)) {
          if (std::optional<double> v = ScalarConstant(k)) {
            next = x, c = *v;
            break;
          }
        }
      } else if (n->is(op::Div)) {
        if (std::optional<double> v = ScalarConstant(n->input(1)); v && *v != 0) next = n->input(0), c = 1.0 / *v;
      }
      if (next) {
        // Factors after a mask (met first walking back) scale the mask, or the Where's fill, too.
        m->scale *= c;
        since_mask *= c;
        if (!add_seen) m->mask_scale *= c;
        if (!select_seen) m->fill_scale *= c;
      } else if (n->is(op::Tanh) && !tanh_seen && since_mask != 0 && scores_like(n->input(0), 0)) {
        // Logit soft-capping, c * tanh(s / c): the factors met since the masks (after the tanh)
        // are its outer c; those met from here on (inside) stay the scale.
        m->softcap = since_mask;
        m->scale /= since_mask;
        tanh_seen = true;
        next = n->input(0);
      } else if ((n->is(op::Where) || n->is(op::Add)) && tanh_seen) {
        break;  // a mask inside the soft-cap: not the kernel's order
      } else if (n->is(op::Where) && !select_seen && n->input(0)->dtype() == DType::kBool) {
        const std::optional<double> fill_false = ScalarConstant(n->input(2)), fill_true = ScalarConstant(n->input(1));
        if (fill_false && scores_like(n->input(1), 0)) {
          next = n->input(1), m->mask_select = 1, m->mask_fill = *fill_false;
        } else if (fill_true && scores_like(n->input(2), 0)) {
          next = n->input(2), m->mask_select = -1, m->mask_fill = *fill_true;
        } else {
          break;
        }
        m->bool_mask = n->input(0);
        m->select_first = add_seen;  // an Add met first walking back comes after the Where
        select_seen = true;
        since_mask = 1;
        // masked_fill(~mask, c) exports as Where(Cast(Not(mask), bool), c, s): a Not read by
        // nothing else flips the selection instead of running; a Cast of bool to bool is a copy.
        for (Node* p = m->bool_mask->producer(); p && match::HasSingleUse(m->bool_mask); p = m->bool_mask->producer()) {
          const bool is_not = p->is(op::Not);
          const bool is_copy = p->is(op::Cast) && p->output()->dtype() == DType::kBool;
          if (!(is_not || is_copy) || p->input(0)->dtype() != DType::kBool) break;
          if (is_not) m->mask_select = -m->mask_select;
          m->mask_nodes.push_back(p);
          m->bool_mask = p->input(0);
        }
      } else if (n->is(op::Add) && !add_seen) {
        const int si = scores_like(n->input(0), 0) ? 0 : scores_like(n->input(1), 0) ? 1 : -1;
        if (si < 0) break;
        next = n->input(si);
        m->mask = n->input(1 - si);
        add_seen = true;
        since_mask = 1;
      } else {
        break;
      }
      m->core.push_back(n);
      cur = next;
    }
    std::reverse(m->core.begin(), m->core.end());  // graph order: first after QK^T, softmax last
    m->qk = ProducerOf(cur, op::MatMul);
    if (!m->qk) {
      Refuse(report_, cur->producer() ? cur->producer() : sm, cur->producer() ? sm->name() : m->pv->name(), kUnsupportedPattern,
             StrCat("softmax '", sm->name(), "' feeds MatMul '", m->pv->name(), "' but its input '", cur->name(),
                    "' comes from ", cur->producer() ? cur->producer()->Describe() : std::string("outside the graph's nodes"),
                    ", not from Q K^T through scalar scales, a mask Add and a Where of a bool mask and a scalar"));
      return false;
    }
    return CheckCore(m) && MatchOperands(m);
  }

  // Where(IsNaN(p), 0, p) reading the softmax's output p, as the exporters write after the
  // softmax of a masked SDPA (and graphfuse's ATen translation of it): the IsNaN read by that
  // Where alone, the Where's 0 a scalar constant. CheckCore checks who else reads them.
  void MatchNanGuard(Value* p, Match* m) {
    for (const Use& u : p->uses()) {
      Node* test = u.node;
      if (!test->is(op::IsNaN)) continue;
      const Use* w = SingleUse(test->output());
      if (!w || !w->node->is(op::Where) || w->input_index != 0 || w->node->input(2) != p) continue;
      const std::optional<double> fill = ScalarConstant(w->node->input(1));
      if (!fill || *fill != 0) continue;
      m->guard = {test, w->node};
      return;
    }
  }

  // Shapes, dtypes and privacy of everything between the two MatMuls.
  bool CheckCore(Match* m) {
    Node* qk = m->qk;
    Node* pv = m->pv;
    const Value* q4 = qk->input(0);
    const Value* kt = qk->input(1);
    const Value* v4 = pv->input(1);
    const Value* p = m->softmax->output();
    std::vector<const Value*> all = {q4, kt, v4, p, pv->output()};
    if (m->mask) all.push_back(m->mask);  // (the selecting mask is bool: MatchAt checks)
    for (const Value* x : all)
      if (!RowKernelTakes(x->dtype(), o_) || x->dtype() != q4->dtype()) {
        Refuse(report_, qk, pv->name(), kUnsupportedDtype,
               StrCat("attention runs in f32", o_.narrow_row_kernels ? ", f16 or bf16 (one dtype for all operands)" : " only",
                      "; '", x->name(), "' is ", x->TypeString(), ", '", q4->name(), "' ", q4->TypeString()));
        return false;
      }
    const Shape &qs = q4->shape(), &ks = kt->shape(), &vs = v4->shape();
    const bool rank4 = qs.size() == 4 && ks.size() == 4 && vs.size() == 4;
    const bool rank3 = qs.size() == 3 && ks.size() == 3 && vs.size() == 3;
    if (!(rank4 && qs[0] == ks[0] && qs[1] == ks[1] && qs[0] == vs[0] && qs[1] == vs[1] && ks[3] == vs[2]) &&
        !(rank3 && qs[0] == ks[0] && qs[0] == vs[0] && ks[2] == vs[1])) {
      Refuse(report_, qk, pv->name(), kUnsupportedLayout,
             StrCat("needs Q [B,H,S,d], K^T [B,H,d,Sk], V [B,H,Sk,dv] with equal B and H, or Q [N,S,d], K^T [N,d,Sk], "
                    "V [N,Sk,dv] with equal N (no broadcast batches); got ",
                    q4->TypeString(), ", ", kt->TypeString(), ", ", v4->TypeString()));
      return false;
    }
    m->rank = qs.size();
    if (rank4) {
      m->b = qs[0], m->h = qs[1], m->s = qs[2], m->d = qs[3], m->sk = ks[3], m->dv = vs[3];
    } else {
      m->b = 1, m->h = qs[0], m->s = qs[1], m->d = qs[2], m->sk = ks[2], m->dv = vs[2];
    }
    const Shape scores = rank4 ? Shape{m->b, m->h, m->s, m->sk} : Shape{m->h, m->s, m->sk};
    const int64_t axis = m->softmax->GetInt("axis", -1);
    if (!match::IsLastAxis(axis, m->rank)) {  // the key axis of the scores [B,H,S,Sk] / [N,S,Sk]
      Refuse(report_, m->softmax, pv->name(), kUnsupportedLayout,
             StrCat("softmax over axis ", axis, " of ", p->TypeString(), ", not the key axis"));
      return false;
    }
    std::vector<const Node*> shaped(m->core.begin(), m->core.end());
    shaped.insert(shaped.end(), m->guard.begin(), m->guard.end());
    for (const Node* n : shaped)
      if (n->output()->shape() != scores) {
        Refuse(report_, n, pv->name(), kUnsupportedLayout,
               StrCat(n->Describe(), " gives ", n->output()->TypeString(), ", not the scores' shape ",
                      ShapeToString(scores)));
        return false;
      }
    for (const Value* mk : {m->mask, m->bool_mask})
      if (mk && !BroadcastsTo(mk->shape(), scores)) {
        Refuse(report_, qk, pv->name(), kUnsupportedLayout,
               StrCat("mask '", mk->name(), "' ", mk->TypeString(), " does not broadcast to ", ShapeToString(scores)));
        return false;
      }
    // Every value from Q K^T to the probabilities is read by the next step of the pattern only
    // (the probabilities by the guard's IsNaN and Where, when guarded).
    std::vector<Node*> chain = {qk};
    chain.insert(chain.end(), m->core.begin(), m->core.end());
    chain.insert(chain.end(), m->guard.begin(), m->guard.end());
    for (size_t i = 0; i < chain.size(); ++i) {
      const Value* o = chain[i]->output();
      const Node* next = i + 1 < chain.size() ? chain[i + 1] : pv;
      for (const Use& u : o->uses())
        if (u.node != next && !(chain[i] == m->softmax && !m->guard.empty() && u.node == m->guard.back())) {
          Refuse(report_, chain[i], u.node->name(), kIntermediateEscapes,
                 StrCat("'", o->name(), "' is also read by ", u.node->Describe(),
                        ": the attention kernel never materializes it"));
          return false;
        }
      if (o->is_graph_output()) {
        Refuse(report_, chain[i], next->name(), kIntermediateEscapes,
               StrCat("'", o->name(), "' is a graph output: the attention kernel never materializes it"));
        return false;
      }
    }
    return true;
  }

  bool Allowed(const Match& m, const std::string& name) {
    if (o_.exclude.count(name)) {
      Refuse(report_, m.qk, m.pv->name(), refusal::kExcluded, StrCat("group ", name, " is excluded by option"));
      return false;
    }
    for (const Node* n : AllNodes(m))
      if (o_.exclude.count(n->name())) {
        Refuse(report_, m.qk, m.pv->name(), refusal::kExcluded, StrCat("node '", n->name(), "' is excluded by option"));
        return false;
      }
    return true;
  }

  // A scalar Mul / Div of Q (or K) read by the pattern alone, as nn.MultiheadAttention scales q
  // by 1/sqrt(d) before the scores: it scales the scores (not the mask), so it joins `scale`.
  Value* TakeScalarScale(Value* x, Match* m, Operand* op) {
    for (;;) {
      Node* n = SingleUseProducer(x, op::Mul);
      if (!n) n = SingleUseProducer(x, op::Div);
      if (!n) return x;
      Value* next = nullptr;
      double c = 0;
      if (n->is(op::Mul)) {
        for (auto [y, k] : match::OperandOrders(*n))
          if (std::optional<double> v = ScalarConstant(k)) {
            next = y, c = *v;
            break;
          }
      } else if (std::optional<double> v = ScalarConstant(n->input(1)); v && *v != 0) {
        next = n->input(0), c = 1.0 / *v;
      }
      if (!next || next->shape() != x->shape()) return x;
      m->scale *= c;
      op->nodes.push_back(n);
      x = next;
    }
  }

  bool MatchOperands(Match* m) {
    const size_t rank = m->rank;
    Operand q_scale, k_scale;  // the scalar scales taken, if any
    Value* q = TakeScalarScale(m->qk->input(0), m, &q_scale);
    m->q = MatchHeads(q, true, m->s, m->d, nullptr, rank);
    m->q.nodes.insert(m->q.nodes.end(), q_scale.nodes.begin(), q_scale.nodes.end());
    // K: K^T from a Transpose of K rows, or of the pre-split tensor, or read as given.
    Value* kt = TakeScalarScale(m->qk->input(1), m, &k_scale);
    Node* t = SingleUseProducer(kt, op::Transpose);
    const std::vector<int64_t> perm = t ? t->GetInts("perm") : std::vector<int64_t>{};
    // K and V repeated from fewer heads alike (GQA): the kernel reads the fewer heads.
    std::optional<RepeatedHeads> rk, rv;
    if (rank == 4 && t && perm == RowsToKtPerm(rank)) rk = MatchRepeatKv(t->input(0));
    if (rk) rv = MatchRepeatKv(m->pv->input(1));
    const bool grouped = rk && rv && rk->kv == rv->kv;
    m->kv_h = grouped ? rk->kv : m->h;
    if (t && perm == RowsToKtPerm(rank)) {
      m->k = MatchHeads(grouped ? rk->x : t->input(0), true, m->sk, m->d, &m->q, rank);
      if (grouped) m->k.nodes.insert(m->k.nodes.begin(), rk->nodes.begin(), rk->nodes.end());
      m->k.nodes.insert(m->k.nodes.begin(), t);
    } else if (t && (perm == SplitToKtPerm(rank) || (rank == 4 && perm == kSeqFirstToKt))) {
      m->k.input = t->input(0);
      m->k.layout = perm == SplitToKtPerm(rank) ? "bshd" : "sbhd";
      m->k.nodes.push_back(t);
      if (Node* r = SingleUseProducer(m->k.input, op::Reshape)) {
        m->k.nodes.push_back(r);
        m->k.input = r->input(0);
      }
    } else {
      m->k.input = kt;
      m->k.layout = "bhds";
    }
    m->k.nodes.insert(m->k.nodes.end(), k_scale.nodes.begin(), k_scale.nodes.end());
    m->v = MatchHeads(grouped ? rv->x : m->pv->input(1), false, m->sk, m->dv, nullptr, rank);
    if (grouped) m->v.nodes.insert(m->v.nodes.end(), rv->nodes.begin(), rv->nodes.end());
    // Output: [B,H,S,dv], or [B,S,H*dv] order when the head merge is ours to absorb.
    m->out = m->pv->output();
    if (const Use* t = SingleUse(m->out);
        t && t->node->is(op::Transpose) &&
        (t->node->GetInts("perm") == HeadSwapPerm(rank) || (rank == 4 && t->node->GetInts("perm") == kHeadsToSeqFirst))) {
      m->out_nodes.push_back(t->node);
      m->out = t->node->output();
      m->out_layout = t->node->GetInts("perm") == HeadSwapPerm(rank) ? "bshd" : "sbhd";
      if (const Use* r = SingleUse(m->out); r && r->node->is(op::Reshape) && r->input_index == 0) {
        m->out_nodes.push_back(r->node);
        m->out = r->node->output();
      }
    }
    for (const Operand* op : {&m->q, &m->k, &m->v})
      if (op->input->dtype() != m->qk->input(0)->dtype()) {  // a Rope / Reshape never changes the dtype; be safe
        Refuse(report_, m->qk, m->pv->name(), kUnsupportedDtype, StrCat("'", op->input->name(), "' is ", op->input->TypeString()));
        return false;
      }
    return SeqFirstAsMergedHeads(m);
  }

  // Seq-first heads ([S,B,H,d], as nn.MultiheadAttention's batch_first=False writes them, read
  // through Transpose perm 1,2,0,3; K^T through perm 1,2,3,0; the output back through perm
  // 2,0,1,3) are run as one sequence of B*H heads: head (b, h) of [S,B,H,d] starts at (b*H + h)*d
  // and its rows are B*H*d apart, the bshd layout of B = 1, H = B*H. That needs Q, K, V and the
  // output all seq-first, one K / V head per query head, no RoPE, and a mask that is the same for
  // every batch and head.
  bool SeqFirstAsMergedHeads(Match* m) {
    const std::vector<const std::string*> layouts = {&m->q.layout, &m->k.layout, &m->v.layout, &m->out_layout};
    const auto seq_first = [](const std::string* l) { return *l == "sbhd"; };
    if (std::none_of(layouts.begin(), layouts.end(), seq_first)) return true;
    std::string why;
    if (!std::all_of(layouts.begin(), layouts.end(), seq_first))
      why = StrCat("Q, K, V and the output are read in layouts ", m->q.layout, ", ", m->k.layout, ", ", m->v.layout,
                   ", ", m->out_layout, ": seq-first heads run merged only when all four are");
    else if (m->q.rope || m->k.rope)
      why = "RoPE tables are per batch and head; merged seq-first heads do not take them";
    else if (m->kv_h != m->h)
      why = "grouped K / V heads do not merge with the batch";
    for (const Value* mk : {m->mask, m->bool_mask})
      if (why.empty() && mk && !BroadcastsTo(mk->shape(), Shape{1, 1, m->s, m->sk}))
        why = StrCat("mask '", mk->name(), "' ", mk->TypeString(), " differs across batches or heads");
    if (!why.empty()) {
      Refuse(report_, m->qk, m->pv->name(), kUnsupportedLayout, StrCat("seq-first heads [S,B,H,d] stay apart: ", why));
      return false;
    }
    for (std::string* l : {&m->q.layout, &m->k.layout, &m->v.layout, &m->out_layout}) *l = "bshd";
    m->h *= m->b;
    m->kv_h = m->h;
    m->b = 1;
    return true;
  }

  std::vector<Node*> AllNodes(const Match& m) const {
    std::vector<Node*> all = {m.qk, m.pv};
    all.insert(all.end(), m.core.begin(), m.core.end());
    for (const Operand* op : {&m.q, &m.k, &m.v}) all.insert(all.end(), op->nodes.begin(), op->nodes.end());
    all.insert(all.end(), m.out_nodes.begin(), m.out_nodes.end());
    all.insert(all.end(), m.mask_nodes.begin(), m.mask_nodes.end());
    all.insert(all.end(), m.guard.begin(), m.guard.end());
    std::sort(all.begin(), all.end(), [&](Node* a, Node* b) { return index_.at(a) < index_.at(b); });
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }

  Status Rewrite(const Match& m, const std::string& name) {
    const std::vector<Node*> members = AllNodes(m);
    // Inputs: q, k, v, then the added mask, the bool mask, then cos and sin.
    std::vector<Value*> inputs = {m.q.input, m.k.input, m.v.input};
    if (m.mask) inputs.push_back(m.mask);
    if (m.bool_mask) inputs.push_back(m.bool_mask);
    const Node* rope = m.q.rope ? m.q.rope : m.k.rope;
    if (rope) inputs.push_back(rope->input(1)), inputs.push_back(rope->input(2));

    // The reference: the original ops, reading the fused node's inputs one to one.
    GF_ASSIGN_OR_RETURN(std::shared_ptr<Graph> ref, BuildReferenceGraph(name, inputs, members, {m.out}));

    std::string kernel = "attention";
    if (rope) kernel += "_rope";
    if (m.mask) kernel += "_mask";
    if (m.bool_mask) kernel += "_boolmask";
    if (m.softcap != 0) kernel += "_softcap";
    const std::string hash = Hash8(StrCat(PrintGraph(*ref), m.q.layout, m.k.layout, m.v.layout, m.out_layout));
    kernel += StrCat("_h", m.h, m.kv_h != m.h ? StrCat("_kv", m.kv_h) : std::string(), "_d", m.d, "_f32_", hash);

    AttributeMap attrs{
        {"batch", m.b},
        {"heads", m.h},
        {"seq_q", m.s},
        {"seq_k", m.sk},
        {"head_dim", m.d},
        {"v_head_dim", m.dv},
        {"q_layout", m.q.layout},
        {"k_layout", m.k.layout},
        {"v_layout", m.v.layout},
        {"out_layout", m.out_layout},
        {"output_shape", std::vector<int64_t>(m.out->shape().begin(), m.out->shape().end())},
        {"scale", static_cast<float>(m.scale)},
        {"mask_scale", static_cast<float>(m.mask_scale)},
        {"has_mask", int64_t{m.mask != nullptr}},
        {"mask_select", int64_t{m.mask_select}},
        {"mask_fill", static_cast<float>(m.mask_fill * m.fill_scale)},
        {"mask_select_first", int64_t{m.select_first}},
        {"rope_q", int64_t{m.q.rope != nullptr}},
        {"rope_k", int64_t{m.k.rope != nullptr}},
        {"kernel_name", kernel},
        {"reference", std::shared_ptr<const Graph>(ref)},
    };
    if (m.kv_h != m.h) attrs["kv_heads"] = m.kv_h;
    if (!m.guard.empty()) attrs["zero_nan_rows"] = int64_t{1};
    if (m.softcap != 0) attrs["softcap"] = static_cast<float>(m.softcap);
    if (rope && rope->GetInt("rotary_dim", 0) > 0) attrs["rope_dim"] = rope->GetInt("rotary_dim", 0);
    if (rope && rope->GetInt("interleaved", 0) != 0) attrs["rope_interleaved"] = int64_t{1};
    if (rope && (m.q.rope ? m.q.rope_bshd : m.k.rope_bshd)) attrs["rope_tables"] = std::string("bshd");
    auto fused = g_.AddNode("FusedAttention", inputs, std::move(attrs), name);
    if (!fused.ok()) return fused.status().WithContext(StrCat("forming ", name, " from ", m.qk->Describe()));
    if ((*fused)->output()->shape() != m.out->shape())
      return Internal(name, ": gives ", (*fused)->output()->TypeString(), " in place of '", m.out->name(), "' ",
                      m.out->TypeString());
    renames_.push_back({(*fused)->output(), m.out->name()});
    g_.ReplaceAllUsesWith(m.out, (*fused)->output());

    FusedGroupInfo info;
    info.name = name;
    info.kind = "attention";
    info.kernel_name = kernel;
    for (Node* n : members) {
      info.nodes.push_back(n->name());
      absorbed_.insert(n);
    }
    if (report_) report_->groups.push_back(std::move(info));
    return Status::Ok();
  }

  Graph& g_;
  const FusionOptions& o_;
  FusionReport* report_;
  std::map<const Node*, int> index_;
  std::set<const Node*> absorbed_;
  std::vector<std::pair<Value*, std::string>> renames_;
};

}  // namespace

Result<int> FuseAttention(Graph& g, const FusionOptions& options, FusionReport* report) {
  if (!options.enabled) return 0;
  return AttentionFuser(g, options, report).Run();
}

}  // namespace graphfuse
