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

#include "../core/prepared_store.h"
#include "core/hash.h"
#include "../ir/op_registry.h"
#include "../ir/text.h"
#include "../ir/schemas/attention_layout.h"
#include "../ir/schemas/fused_gemm.h"
#include "fusion_passes.h"
#include "match.h"
#include "reference_graph.h"

namespace graphfuse {
namespace {

// Stable refusal codes of this pass (the --json contract: never renamed, only added to).
constexpr const char* kIntermediateEscapes = "attention-intermediate-escapes";  // scores/probs read elsewhere
constexpr const char* kUnsupportedLayout = "attention-unsupported-layout";      // ranks, broadcast batches, axis
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
  void Refuse(const Node* producer, const std::string& consumer, const char* code, const std::string& message) {
    if (report_) report_->refusals.push_back({producer->name(), consumer, code, message});
  }

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
              Refuse(sm, w.node->name(), kUnsupportedLayout,
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
      Refuse(cur->producer() ? cur->producer() : sm, cur->producer() ? sm->name() : m->pv->name(), kUnsupportedPattern,
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
        Refuse(qk, pv->name(), kUnsupportedDtype,
               StrCat("attention runs in f32", o_.narrow_row_kernels ? ", f16 or bf16 (one dtype for all operands)" : " only",
                      "; '", x->name(), "' is ", x->TypeString(), ", '", q4->name(), "' ", q4->TypeString()));
        return false;
      }
    const Shape &qs = q4->shape(), &ks = kt->shape(), &vs = v4->shape();
    const bool rank4 = qs.size() == 4 && ks.size() == 4 && vs.size() == 4;
    const bool rank3 = qs.size() == 3 && ks.size() == 3 && vs.size() == 3;
    if (!(rank4 && qs[0] == ks[0] && qs[1] == ks[1] && qs[0] == vs[0] && qs[1] == vs[1] && ks[3] == vs[2]) &&
        !(rank3 && qs[0] == ks[0] && qs[0] == vs[0] && ks[2] == vs[1])) {
      Refuse(qk, pv->name(), kUnsupportedLayout,
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
      Refuse(m->softmax, pv->name(), kUnsupportedLayout,
             StrCat("softmax over axis ", axis, " of ", p->TypeString(), ", not the key axis"));
      return false;
    }
    std::vector<const Node*> shaped(m->core.begin(), m->core.end());
    shaped.insert(shaped.end(), m->guard.begin(), m->guard.end());
    for (const Node* n : shaped)
      if (n->output()->shape() != scores) {
        Refuse(n, pv->name(), kUnsupportedLayout,
               StrCat(n->Describe(), " gives ", n->output()->TypeString(), ", not the scores' shape ",
                      ShapeToString(scores)));
        return false;
      }
    for (const Value* mk : {m->mask, m->bool_mask})
      if (mk && !BroadcastsTo(mk->shape(), scores)) {
        Refuse(qk, pv->name(), kUnsupportedLayout,
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
          Refuse(chain[i], u.node->name(), kIntermediateEscapes,
                 StrCat("'", o->name(), "' is also read by ", u.node->Describe(),
                        ": the attention kernel never materializes it"));
          return false;
        }
      if (o->is_graph_output()) {
        Refuse(chain[i], next->name(), kIntermediateEscapes,
               StrCat("'", o->name(), "' is a graph output: the attention kernel never materializes it"));
        return false;
      }
    }
    return true;
  }

  bool Allowed(const Match& m, const std::string& name) {
    if (o_.exclude.count(name)) {
      Refuse(m.qk, m.pv->name(), refusal::kExcluded, StrCat("group ", name, " is excluded by option"));
      return false;
    }
    for (const Node* n : AllNodes(m))
      if (o_.exclude.count(n->name())) {
        Refuse(m.qk, m.pv->name(), refusal::kExcluded, StrCat("node '", n->name(), "' is excluded by option"));
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
        Refuse(m->qk, m->pv->name(), kUnsupportedDtype, StrCat("'", op->input->name(), "' is ", op->input->TypeString()));
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
      Refuse(m->qk, m->pv->name(), kUnsupportedLayout, StrCat("seq-first heads [S,B,H,d] stay apart: ", why));
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

// ---- the QKV projection inside the attention ----------------------------------------------

namespace {

// What the projected form takes of a FusedGemm: per output, the projection (column block of W)
// it is; and per projection its bias when the epilogue adds one to each projection and does
// nothing else (p_s + b_s, either operand order; b_s a constant f32 of N values along the last
// dim: GPT-2's, BERT's, Qwen2's and nn.MultiheadAttention's in-projection). None for any other
// epilogue.
struct GemmProjections {
  int64_t splits = 0, n = 0;  // projections of N columns each
  std::vector<int64_t> proj_of_output;
  std::vector<Value*> bias_inputs;  // per projection: the node input holding its bias (empty without)
};

std::optional<GemmProjections> GemmProjectionsOf(const Node& gemm) {
  const schemas::FusedGemmAttrs attrs = schemas::FusedGemmAttrs::Read(gemm);
  const int64_t splits = attrs.splits;
  const std::vector<int64_t>& out_proj = attrs.out_proj;
  if (splits < 1 || gemm.inputs().size() < 2 || !gemm.input(1) || gemm.input(1)->shape().size() != 2 ||
      out_proj.size() != gemm.outputs().size() || attrs.row_scale >= 0 || attrs.rms_epsilon)
    return std::nullopt;
  const int64_t n = gemm.input(1)->shape()[1] / splits;
  GemmProjections form{splits, n, {}, {}};
  const Graph* epilogue = attrs.epilogue.get();
  if (!epilogue) {
    if (gemm.inputs().size() != 2) return std::nullopt;
    form.proj_of_output = out_proj;
    return form;
  }
  // Every output an epilogue output, each one Add of a projection and a bias input.
  if (epilogue->nodes().size() != static_cast<size_t>(splits) || out_proj.size() != static_cast<size_t>(splits) ||
      epilogue->outputs().size() != out_proj.size() ||
      epilogue->inputs().size() != gemm.inputs().size() - 2 + static_cast<size_t>(splits))
    return std::nullopt;
  form.bias_inputs.assign(static_cast<size_t>(splits), nullptr);
  for (size_t o = 0; o < out_proj.size(); ++o) {
    const Node* add = epilogue->outputs()[o]->producer();
    if (out_proj[o] != -1 || !add || !add->is(op::Add)) return std::nullopt;
    int64_t proj = -1;
    Value* bias = nullptr;
    for (auto [p, b] : match::OperandOrders(*add)) {
      const auto& ins = epilogue->inputs();
      const auto pi = std::find(ins.begin(), ins.end(), p) - ins.begin();
      const auto bi = std::find(ins.begin(), ins.end(), b) - ins.begin();
      if (pi < splits && bi >= splits && bi < static_cast<long>(ins.size())) {
        proj = pi;
        bias = gemm.input(static_cast<size_t>(2 + bi - splits));
        break;
      }
    }
    if (proj < 0 || form.bias_inputs[static_cast<size_t>(proj)] || !bias || !bias->constant() ||
        bias->dtype() != DType::kF32 || bias->numel() != n || bias->shape().empty() || bias->shape().back() != n)
      return std::nullopt;
    form.bias_inputs[static_cast<size_t>(proj)] = bias;
    form.proj_of_output.push_back(proj);
  }
  return form;
}

// What the projected form takes of a QKV FusedGemm: GemmProjections of three, with its biases
// in W's column order as one [3N] constant.
struct QkvGemmForm {
  std::vector<int64_t> proj_of_output;
  std::shared_ptr<const Tensor> bias;  // [3N], or null without an epilogue
  std::vector<Value*> bias_inputs;     // per projection: the node input holding its bias
};

std::optional<QkvGemmForm> QkvFormOf(const Node& gemm) {
  std::optional<GemmProjections> p = GemmProjectionsOf(gemm);
  if (!p || p->splits != 3) return std::nullopt;
  QkvGemmForm form{p->proj_of_output, nullptr, p->bias_inputs};
  if (form.bias_inputs.empty()) return form;
  const int64_t n = p->n;
  auto cat = std::make_shared<Tensor>(Tensor::Empty(DType::kF32, {3 * n}).value());
  for (int64_t s = 0; s < 3; ++s) {
    const float* b = form.bias_inputs[static_cast<size_t>(s)]->constant()->data_as<float>();
    std::copy(b, b + n, cat->data_as<float>() + s * n);
  }
  form.bias = std::move(cat);
  return form;
}

// In a reference graph: the GEMM's bias inputs (gemm inputs 2, ...) as slices of `bias`
// (projection s's N values at offset + s*N), each viewed with its own shape.
Result<std::vector<Value*>> BiasSlices(Graph& ref, Value* bias, const Node& gemm, const std::vector<Value*>& per_proj,
                                       int64_t offset, int64_t n) {
  std::vector<Value*> out;
  for (size_t i = 2; i < gemm.inputs().size(); ++i) {
    const Value* b = gemm.input(i);
    const int64_t s = std::find(per_proj.begin(), per_proj.end(), b) - per_proj.begin();
    if (s >= static_cast<int64_t>(per_proj.size()))
      return Internal(gemm.Describe(), ": input '", b->name(), "' is no projection's bias");
    GF_ASSIGN_OR_RETURN(Value * starts, match::AddIntsConstant(ref, "starts", {offset + s * n}));
    GF_ASSIGN_OR_RETURN(Value * ends, match::AddIntsConstant(ref, "ends", {offset + (s + 1) * n}));
    GF_ASSIGN_OR_RETURN(Node * slice, ref.AddNode("Slice", {bias, starts, ends}, {}, b->name() + "/slice"));
    Value* v = slice->output();
    if (v->shape() != b->shape()) {
      GF_ASSIGN_OR_RETURN(Value * shape,
                          match::AddIntsConstant(ref, "shape", std::vector<int64_t>(b->shape().begin(), b->shape().end())));
      GF_ASSIGN_OR_RETURN(Node * r, ref.AddNode("Reshape", {v, shape}, {}, b->name() + "/view"));
      v = r->output();
    }
    out.push_back(v);
  }
  return out;
}

// The report: the groups (or lone nodes) computing an attention's q, k and v join the
// attention's group, which takes the fused node's kernel name.
void JoinAttentionGroup(FusionReport* report, const std::string& attention, const std::vector<const Node*>& sources,
                        const std::string& kernel) {
  if (!report) return;
  std::vector<std::string> nodes;
  for (const Node* src : sources) {
    auto it = std::find_if(report->groups.begin(), report->groups.end(),
                           [&](const FusedGroupInfo& gi) { return gi.name == src->name(); });
    if (it == report->groups.end()) {
      nodes.push_back(src->name());
      continue;
    }
    nodes.insert(nodes.end(), it->nodes.begin(), it->nodes.end());
    report->groups.erase(it);
  }
  for (FusedGroupInfo& gi : report->groups)
    if (gi.name == attention) {
      gi.nodes.insert(gi.nodes.begin(), nodes.begin(), nodes.end());
      gi.kernel_name = kernel;
    }
}

// Replaces attention `a` by its projected form: a FusedAttention reading `inputs` with `attrs`
// and the reference graph `ref`; the projection GEMMs `sources` go with it (graph and report).
// The new node's output takes a's name once the pass is done (`renames`).
Status ReplaceWithProjectedAttention(Graph& g, Node* a, const std::vector<Value*>& inputs, AttributeMap attrs,
                                     std::shared_ptr<const Graph> ref, const std::vector<Node*>& sources,
                                     FusionReport* report, std::vector<std::pair<Value*, std::string>>& renames) {
  attrs["kernel_name"] = StrCat("qkv_", a->GetString("kernel_name", "attention"));
  attrs["reference"] = std::move(ref);
  const std::string name = a->name();
  GF_ASSIGN_OR_RETURN(Node * fused, g.AddNode("FusedAttention", inputs, std::move(attrs), name));
  if (fused->output()->shape() != a->output()->shape())
    return Internal(name, ": the projected form gives ", fused->output()->TypeString(), " in place of ",
                    a->output()->TypeString());
  renames.push_back({fused->output(), a->output()->name()});
  g.ReplaceAllUsesWith(a->output(), fused->output());
  JoinAttentionGroup(report, name, std::vector<const Node*>(sources.begin(), sources.end()),
                     fused->GetString("kernel_name", ""));
  g.RemoveNode(a);
  for (Node* s : sources) g.RemoveNode(s);
  return Status::Ok();
}

// One of q, k, v as a projection of x by constant f32 weights: a MatMul, or one output of a
// FusedGemm (GemmProjectionsOf), with the projection's bias when the GEMM adds one.
struct ProjectionOf {
  Node* node = nullptr;
  int64_t proj = 0, n = 0;  // which of the node's projections; its columns
  int64_t projections = 1;  // the node's projections
  Value* bias = nullptr;
  std::vector<Value*> bias_inputs;  // the node's biases per projection (FusedGemm)
};

std::optional<ProjectionOf> ProjectionSource(const Value* v) {
  Node* p = v->producer();
  if (!p || p->inputs().size() < 2 || !p->input(0) || !p->input(1) || !p->input(1)->constant() ||
      p->input(0)->dtype() != DType::kF32 || p->input(1)->dtype() != DType::kF32 || p->input(1)->shape().size() != 2 ||
      p->input(0)->shape().size() < 2)
    return std::nullopt;
  if (p->is(op::MatMul)) return ProjectionOf{p, 0, p->input(1)->shape()[1], 1, nullptr, {}};
  if (!p->is(op::FusedGemm)) return std::nullopt;
  std::optional<GemmProjections> form = GemmProjectionsOf(*p);
  if (!form) return std::nullopt;
  for (size_t o = 0; o < p->outputs().size(); ++o)
    if (p->output(o) == v && form->proj_of_output[o] >= 0) {
      const int64_t proj = form->proj_of_output[o];
      return ProjectionOf{p, proj, form->n, form->splits,
                          form->bias_inputs.empty() ? nullptr : form->bias_inputs[static_cast<size_t>(proj)],
                          form->bias_inputs};
    }
  return std::nullopt;
}

// A FusedAttention whose q, k and v come from separate GEMMs of one x (a MatMul and a FusedGemm,
// or three MatMuls): grouped-query attention's q and k / v projections differ in width, so
// FuseGemm keeps them apart. They move into the attention as one projected form: W is their
// weights side by side (each GEMM's columns as they were, in the order the GEMMs come), the
// biases likewise (zeros for a GEMM without), and qkv_split orders the q, k and v blocks. Every
// output of each GEMM must be q, k or v of this attention and read by nothing else. Returns
// whether it formed.
Result<bool> FuseProjectionsApart(Graph& g, Node* a, const FusionOptions& options, FusionReport* report,
                                  std::vector<std::pair<Value*, std::string>>& renames) {
  ProjectionOf src[3];
  std::vector<ProjectionOf> nodes;  // distinct GEMMs, in order of their q / k / v
  for (int t = 0; t < 3; ++t) {
    std::optional<ProjectionOf> p = ProjectionSource(a->input(static_cast<size_t>(t)));
    if (!p || (t > 0 && p->node->input(0) != src[0].node->input(0))) return false;
    src[t] = *p;
    if (std::none_of(nodes.begin(), nodes.end(), [&](const ProjectionOf& q) { return q.node == p->node; }))
      nodes.push_back(*p);
  }
  if (a->input(0) == a->input(1) || a->input(1) == a->input(2) || a->input(0) == a->input(2)) return false;
  for (const ProjectionOf& p : nodes) {
    if (static_cast<int64_t>(p.node->outputs().size()) != p.projections) return false;
    for (const Value* o : p.node->outputs()) {
      const Use* u = match::SingleUse(o);
      if (!u || u->node != a || u->input_index > 2) return false;
    }
  }
  auto refuse = [&](const char* code, const std::string& why) {
    if (report) report->refusals.push_back({nodes.front().node->name(), a->name(), code, why});
  };
  for (const ProjectionOf& p : nodes)
    if (options.exclude.count(p.node->name()) || options.exclude.count(a->name())) {
      refuse(refusal::kExcluded, "the q / k / v GEMMs stay apart from the attention: one of them is excluded");
      return false;
    }
  // W's columns: each GEMM's weights in turn; q, k and v's blocks where their projections lie.
  std::vector<int64_t> node_col;
  int64_t cols = 0;
  for (const ProjectionOf& p : nodes) {
    node_col.push_back(cols);
    cols += p.node->input(1)->shape()[1];
  }
  int64_t offset[3];
  for (int t = 0; t < 3; ++t) {
    const size_t i = static_cast<size_t>(
        std::find_if(nodes.begin(), nodes.end(), [&](const ProjectionOf& q) { return q.node == src[t].node; }) -
        nodes.begin());
    offset[t] = node_col[i] + src[t].proj * src[t].n;
  }
  std::vector<int64_t> split(3);
  for (int t = 0; t < 3; ++t) split[t] = (offset[(t + 1) % 3] < offset[t]) + (offset[(t + 2) % 3] < offset[t]);
  AttributeMap attrs = a->attrs();
  attrs["qkv_proj"] = int64_t{1};
  attrs["qkv_split"] = split;
  const bool biased = std::any_of(nodes.begin(), nodes.end(), [](const ProjectionOf& p) { return !p.bias_inputs.empty(); });
  if (biased) attrs["qkv_bias"] = int64_t{1};
  const Result<schemas::Dims> dims = schemas::ReadDims(attrs, a->Describe());
  if (!dims.ok()) {
    refuse(kUnsupportedLayout, StrCat("the q / k / v GEMMs stay apart: ", dims.status().message()));
    return false;
  }
  const Value* x = nodes.front().node->input(0);
  bool widths = cols == dims->proj_cols();
  for (int t = 0; t < 3; ++t) widths &= src[t].n == dims->proj_width(t) && offset[t] == dims->proj_offset(t);
  if (!widths || x->numel() / std::max<int64_t>(x->shape().back(), 1) != dims->b * dims->s) {
    refuse(kUnsupportedLayout,
           StrCat("the q / k / v GEMMs stay apart: the projected form reads B*S = ", dims->b * dims->s,
                  " rows of x and q, k, v of H*d = ", dims->proj_width(0), ", KV*d = ", dims->proj_width(1),
                  " columns (B = ", dims->b, ", H = ", dims->h, ", KV = ", dims->kv_h, "), but x is ", x->TypeString(),
                  " and the projections are ", src[0].n, ", ", src[1].n, ", ", src[2].n, " wide"));
    return false;
  }

  // W and the biases, the GEMMs' side by side.
  const int64_t k = x->shape().back();
  std::vector<const Tensor*> weights;
  std::string how = "side by side at columns";
  for (size_t i = 0; i < nodes.size(); ++i) {
    weights.push_back(nodes[i].node->input(1)->constant().get());
    how += StrCat(" ", node_col[i]);
  }
  GF_ASSIGN_OR_RETURN(auto wt, DeriveTensor(g.prepared_store(), weights, how, [&]() -> Result<Tensor> {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {k, cols}));
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int64_t ni = nodes[i].node->input(1)->shape()[1];
      const float* src_w = weights[i]->data_as<float>();
      for (int64_t r = 0; r < k; ++r)
        std::copy(src_w + r * ni, src_w + (r + 1) * ni, t.data_as<float>() + r * cols + node_col[i]);
    }
    return t;
  }));
  std::vector<float> bias(biased ? static_cast<size_t>(cols) : 0, 0.f);
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (size_t s = 0; s < nodes[i].bias_inputs.size(); ++s) {
      const float* b = nodes[i].bias_inputs[s]->constant()->data_as<float>();
      std::copy(b, b + nodes[i].n, bias.data() + node_col[i] + static_cast<int64_t>(s) * nodes[i].n);
    }
  }
  const std::string scope = nodes.front().node->name();
  GF_ASSIGN_OR_RETURN(Value * w, g.AddConstant(g.FreshName(scope + "_qkv_weights"), std::move(wt)));
  std::vector<Value*> inputs = {const_cast<Value*>(x), w};
  if (biased) {
    GF_ASSIGN_OR_RETURN(Tensor bt, Tensor::Empty(DType::kF32, {cols}));
    std::copy(bias.begin(), bias.end(), bt.data_as<float>());
    GF_ASSIGN_OR_RETURN(Value * bv, g.AddConstant(g.FreshName(scope + "_qkv_bias"),
                                                  std::make_shared<const Tensor>(std::move(bt))));
    inputs.push_back(bv);
  }
  const size_t extras = inputs.size();
  for (size_t i = 3; i < a->inputs().size(); ++i) inputs.push_back(a->input(i));

  // The reference: each GEMM on its columns of W (and of the biases), then the attention.
  auto ref = std::make_shared<Graph>(a->name());
  std::vector<Value*> rin;
  for (Value* in : inputs) {
    GF_ASSIGN_OR_RETURN(Value * ri, ref->AddInput(ref->FreshName(in->name()), in->dtype(), in->shape()));
    rin.push_back(ri);
  }
  std::map<const Value*, Value*> rmap;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i].node;
    GF_ASSIGN_OR_RETURN(Value * starts, match::AddIntsConstant(*ref, "starts", {node_col[i]}));
    GF_ASSIGN_OR_RETURN(Value * ends, match::AddIntsConstant(*ref, "ends", {node_col[i] + n.input(1)->shape()[1]}));
    GF_ASSIGN_OR_RETURN(Value * axes, match::AddIntsConstant(*ref, "axes", {1}));
    GF_ASSIGN_OR_RETURN(Node * wslice, ref->AddNode("Slice", {rin[1], starts, ends, axes}, {}, n.name() + "/weights"));
    std::vector<Value*> rn_in = {rin[0], wslice->output()};
    if (!nodes[i].bias_inputs.empty()) {
      GF_ASSIGN_OR_RETURN(std::vector<Value*> b,
                          BiasSlices(*ref, rin[2], n, nodes[i].bias_inputs, node_col[i], nodes[i].n));
      rn_in.insert(rn_in.end(), b.begin(), b.end());
    }
    std::vector<std::string> out_names;
    for (const Value* o : n.outputs()) out_names.push_back(o->name());
    GF_ASSIGN_OR_RETURN(Node * rn, ref->AddNode(n.op(), rn_in, n.attrs(), n.name(), -1, out_names));
    for (size_t o = 0; o < n.outputs().size(); ++o) rmap[n.output(o)] = rn->output(o);
  }
  std::vector<Value*> ra_in = {rmap.at(a->input(0)), rmap.at(a->input(1)), rmap.at(a->input(2))};
  for (size_t i = extras; i < rin.size(); ++i) ra_in.push_back(rin[i]);
  GF_ASSIGN_OR_RETURN(Node * ra, ref->AddNode("FusedAttention", ra_in, a->attrs(), a->name(), -1,
                                             {a->output()->name()}));
  GF_RETURN_IF_ERROR(ref->MarkOutput(ra->output()));

  std::vector<Node*> sources;
  for (const ProjectionOf& p : nodes) sources.push_back(p.node);
  GF_RETURN_IF_ERROR(ReplaceWithProjectedAttention(g, a, inputs, std::move(attrs), std::move(ref), sources, report,
                                                   renames));
  return true;
}

}  // namespace

//
// A FusedAttention whose q, k and v are the three outputs of one FusedGemm (x @ W, split in
// three, no epilogue, constant W) that nothing else reads becomes one FusedAttention in the
// projected form: it reads x and W, and each head's task computes that head's q, k and v
// ([S, 3d]) into its own scratch before RoPE, the scores and P V read them there (attention.cc).
// The QKV tensor never goes to memory nor to the other core's cache: that saves the reads of
// q, k and v, not the work of RoPE and softmax on them. The reference graph is the two nodes it
// replaces, so `run --check-fusion` checks the projected kernel against them and a backend
// without the form (CUDA) runs them instead. A GEMM whose epilogue adds a bias to each
// projection moves in too: the node then also reads the three biases as one [3*H*d] constant
// (qkv_bias) and adds them to each projected row before RoPE and the scores. Grouped-query
// attention's q and k / v come from separate GEMMs (their widths differ): FuseProjectionsApart
// takes those in the same way, W being their weights side by side.
Result<int> FuseAttentionProjections(Graph& g, const FusionOptions& options, FusionReport* report) {
  if (!options.enabled || !options.attention_projection) return 0;
  std::vector<Node*> attentions;
  for (const auto& n : g.nodes())
    if (n->is(op::FusedAttention) && n->GetInt("qkv_proj", 0) == 0) attentions.push_back(n.get());
  int formed = 0;
  std::vector<std::pair<Value*, std::string>> renames;
  for (Node* a : attentions) {
    if (a->inputs().size() < 3 || !a->input(0) || !a->input(1) || !a->input(2)) continue;
    Node* gemm = ProducerOf(a->input(0), op::FusedGemm);
    if (!gemm || a->input(1)->producer() != gemm || a->input(2)->producer() != gemm) {
      GF_ASSIGN_OR_RETURN(bool apart, FuseProjectionsApart(g, a, options, report, renames));
      formed += apart;
      continue;
    }
    const std::optional<QkvGemmForm> form = QkvFormOf(*gemm);
    if (!form || !gemm->input(1)->constant() || gemm->outputs().size() != 3) continue;
    auto refuse = [&](const char* code, const std::string& why) {
      if (report) report->refusals.push_back({gemm->name(), a->name(), code, why});
    };
    if (options.exclude.count(gemm->name()) || options.exclude.count(a->name())) {
      refuse(refusal::kExcluded, "the QKV GEMM stays apart from the attention: one of them is excluded");
      continue;
    }
    std::vector<int64_t> split(3, -1);
    bool private_outputs = true;
    for (int i = 0; i < 3 && private_outputs; ++i) {
      const Value* v = a->input(i);
      int o = -1;
      for (int j = 0; j < 3; ++j)
        if (gemm->output(j) == v) o = j;
      private_outputs = o >= 0 && match::HasSingleUse(v);
      if (private_outputs) split[i] = form->proj_of_output[static_cast<size_t>(o)];
    }
    if (!private_outputs) {
      refuse(refusal::kTooManyOutputs, "q, k or v is also read outside the attention (or is a graph output): the "
                                       "QKV GEMM keeps writing them");
      continue;
    }
    // The projected form's attributes; the kernel's own reading of them decides whether it
    // takes this attention (layouts, S = Sk, d = dv, the split).
    AttributeMap attrs = a->attrs();
    attrs["qkv_proj"] = int64_t{1};
    attrs["qkv_split"] = split;
    if (form->bias) attrs["qkv_bias"] = int64_t{1};
    const Result<schemas::Dims> dims = schemas::ReadDims(attrs, a->Describe());
    if (!dims.ok()) {
      refuse(kUnsupportedLayout, StrCat("the QKV GEMM stays apart: ", dims.status().message()));
      continue;
    }
    const Value* x = gemm->input(0);
    const Value* w = gemm->input(1);
    if (w->shape().size() != 2 || w->shape()[1] != dims->proj_cols() || x->shape().empty() ||
        x->numel() / std::max<int64_t>(x->shape().back(), 1) != dims->b * dims->s) {
      refuse(kUnsupportedLayout,
             StrCat("the QKV GEMM stays apart: the projected form reads B*S = ", dims->b * dims->s,
                    " rows of x and W [K, 3*H*d = ", 3 * dims->h * dims->d, "] (B = ", dims->b, ", H = ", dims->h,
                    "), but x is ", x->TypeString(), " and W ", w->TypeString(),
                    ": the heads are not the column blocks of one row of x"));
      continue;
    }

    // The reference: the two nodes, reading the new node's inputs one to one.
    std::vector<Value*> inputs = {gemm->input(0), gemm->input(1)};
    if (form->bias) {
      GF_ASSIGN_OR_RETURN(Value * bias, g.AddConstant(g.FreshName(gemm->name() + "_qkv_bias"), form->bias));
      inputs.push_back(bias);
    }
    const size_t extras = inputs.size();  // where the attention's mask / RoPE inputs start
    for (size_t i = 3; i < a->inputs().size(); ++i) inputs.push_back(a->input(i));
    auto ref = std::make_shared<Graph>(a->name());
    std::vector<Value*> rin;
    for (size_t i = 0; i < inputs.size(); ++i) {
      GF_ASSIGN_OR_RETURN(Value * ri, ref->AddInput(ref->FreshName(inputs[i]->name()), inputs[i]->dtype(),
                                                    inputs[i]->shape()));
      rin.push_back(ri);
    }
    std::vector<std::string> gemm_out_names;
    for (const Value* o : gemm->outputs()) gemm_out_names.push_back(o->name());
    std::vector<Value*> rg_in = {rin[0], rin[1]};
    if (form->bias) {  // the GEMM's own bias inputs: its thirds of the one the node reads
      GF_ASSIGN_OR_RETURN(rg_in, BiasSlices(*ref, rin[2], *gemm, form->bias_inputs, 0, rin[2]->shape()[0] / 3));
      rg_in.insert(rg_in.begin(), {rin[0], rin[1]});
    }
    GF_ASSIGN_OR_RETURN(Node * rg, ref->AddNode("FusedGemm", rg_in, gemm->attrs(), gemm->name(), -1,
                                               gemm_out_names));
    std::vector<Value*> ra_in;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j)
        if (gemm->output(j) == a->input(i)) ra_in.push_back(rg->output(j));
    for (size_t i = extras; i < rin.size(); ++i) ra_in.push_back(rin[i]);
    GF_ASSIGN_OR_RETURN(Node * ra, ref->AddNode("FusedAttention", ra_in, a->attrs(), a->name(), -1,
                                               {a->output()->name()}));
    GF_RETURN_IF_ERROR(ref->MarkOutput(ra->output()));

    GF_RETURN_IF_ERROR(ReplaceWithProjectedAttention(g, a, inputs, std::move(attrs), std::move(ref), {gemm}, report,
                                                     renames));
    ++formed;
  }
  if (formed == 0) return 0;
  GF_RETURN_IF_ERROR(g.TopologicalSort());
  for (auto& [v, n] : renames) GF_RETURN_IF_ERROR(g.RenameValue(v, n));
  return formed;
}

}  // namespace graphfuse
