"""FlagEmbedding's M3 fine-tuning loss in keras.ops: one implementation for TensorFlow, JAX and PyTorch.

The reference is `FlagEmbedding.finetune.embedder.encoder_only.m3.modeling.EncoderOnlyEmbedderM3Model.forward`
(FlagEmbedding 1.4) and the helpers it inherits from `abc/finetune/embedder/AbsModeling.py`. Each function
here mirrors one of theirs, named after it, so that the quirks of the code (which differs from the paper in
places) come along: where FlagEmbedding's code and its paper differ, the code is the reference.

The one deliberate difference is how the sparse score is formed. FlagEmbedding scatters each token's weight
into a (batch, length, vocabulary) tensor and takes the max over positions: 65 GB for 128 passages of 512
tokens at BGE-M3's 250,002 ids. `sparse_pair_scores` gives the same scores (and the same gradients: to the
position holding each id's max weight) from the tokens present only: (batch, length, passages, length).

Shapes: B queries, G = group size (1 positive + G - 1 negatives), P = B * G passages, Lq / Lp token counts,
H hidden size, C ColBERT size. Scores are already divided by the temperature.

    >>> terms = m3_loss(queries, passages, LossSettings(unified=True), step=0, group_size=8)
    >>> terms["loss"]  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from keras import ops

# torch.finfo(torch.float32).min: m3_kd_loss masks the targets already taken with it.
FLOAT32_MIN = -3.4028234663852886e38
# FlagEmbedding's ensemble: dense + 0.3 sparse + ColBERT; its unified loss weights (dense + ensemble +
# 0.1 sparse + ColBERT) / 4; self-distillation (dense + 0.1 sparse + ColBERT) / 3, then the total halved.
ENSEMBLE_SPARSE_WEIGHT = 0.3
SPARSE_LOSS_WEIGHT = 0.1
KD_LOSS_TYPES = ("kl_div", "m3_kd_loss")


@dataclass(frozen=True)
class LossSettings:
    """The options of FlagEmbedding's M3 trainer that shape the loss (its defaults)."""

    temperature: float = 0.02
    unified: bool = False  # --unified-finetuning: sparse and ColBERT terms and the ensemble
    self_distill: bool = False  # --use-self-distill
    self_distill_start_step: int = -1
    knowledge_distillation: bool = False  # teacher scores (pos_scores / neg_scores) in the data
    kd_loss_type: str = "kl_div"

    def __post_init__(self) -> None:
        if self.kd_loss_type not in KD_LOSS_TYPES:
            raise ValueError(
                f"kd_loss_type must be one of {', '.join(KD_LOSS_TYPES)}, got {self.kd_loss_type!r}"
            )
        if self.temperature <= 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")


@dataclass
class Representations:
    """One side's training outputs: what `EncoderOnlyEmbedderM3Model._encode` returns, before scoring.

    dense (n, H) L2-normalised CLS; token_weights (n, L) relu(sparse head) with CLS, EOS, PAD and UNK zeroed;
    input_ids (n, L); colbert (n, L - 1, C) L2-normalised, zero on padding; mask (n, L) attention mask.
    """

    dense: Any
    token_weights: Any = None
    input_ids: Any = None
    colbert: Any = None
    mask: Any = None


# --- the three scores ----------------------------------------------------------------------------------


def dense_scores(q: Any, p: Any, temperature: float) -> Any:
    """compute_dense_score: q p^T / temperature, (B, P)."""
    return ops.matmul(q, ops.transpose(p)) / temperature


def _id_representatives(weights: Any, ids: Any) -> Any:
    """weights where the position holds its id's largest weight in the row (the first such position on a
    tie), else 0: the row's sparse vector is then the sum of these at their ids, as FlagEmbedding's max over
    positions is. The choice is a constant of the graph: the gradient reaches the position holding the max,
    where torch.max sends it."""
    same = ops.equal(ops.expand_dims(ids, 2), ops.expand_dims(ids, 1))  # (n, L, L): l and m share an id
    w_l = ops.expand_dims(weights, 2)
    w_m = ops.expand_dims(weights, 1)
    length = ops.shape(weights)[1]
    position = ops.arange(length)
    earlier = ops.less(ops.expand_dims(position, 1), ops.expand_dims(position, 0))  # (L, L): l < m
    wins = ops.logical_or(ops.greater(w_l, w_m), ops.logical_and(ops.equal(w_l, w_m), earlier))
    loses = ops.logical_and(same, ops.logical_not(wins))
    diagonal = ops.equal(ops.expand_dims(position, 1), ops.expand_dims(position, 0))
    keep = ops.logical_not(ops.any(ops.logical_and(loses, ops.logical_not(diagonal)), axis=2))
    return weights * ops.stop_gradient(ops.cast(keep, weights.dtype))


def sparse_pair_scores(q_weights: Any, q_ids: Any, p_weights: Any, p_ids: Any) -> Any:
    """The lexical score of every query with every passage, (B, P), without a vocabulary-sized tensor.

    score(q, p) = sum over ids v of q[v] p[v], with q[v] the max weight of id v in q (FlagEmbedding's
    training `_sparse_embedding` then `_compute_similarity`). Special ids must already have weight 0.
    """
    q_rep = _id_representatives(q_weights, q_ids)  # (B, Lq)
    p_rep = _id_representatives(p_weights, p_ids)  # (P, Lp)
    # (B, Lq, P, Lp): does query token a carry the id of passage token b
    match = ops.equal(
        ops.expand_dims(ops.expand_dims(q_ids, 2), 3), ops.expand_dims(ops.expand_dims(p_ids, 0), 0)
    )
    match = ops.cast(match, q_rep.dtype)
    per_query_token = ops.einsum("aipj,pj->aip", match, p_rep)  # (B, Lq, P)
    return ops.einsum("ai,aip->ap", q_rep, per_query_token)


def sparse_scores(q: Representations, p: Representations, temperature: float) -> Any:
    """compute_sparse_score on the sparse vectors: (B, P) / temperature."""
    return sparse_pair_scores(q.token_weights, q.input_ids, p.token_weights, p.input_ids) / temperature


def colbert_scores(q: Representations, p: Representations, temperature: float) -> Any:
    """compute_colbert_score: per query token the max over every passage token (padding's zero vectors
    included, as FlagEmbedding's einsum has them), summed, over the query's token count after CLS."""
    token_scores = ops.einsum("qin,pjn->qipj", q.colbert, p.colbert)
    best = ops.max(token_scores, axis=-1)  # (B, Lq - 1, P)
    counts = ops.sum(ops.cast(q.mask[:, 1:], best.dtype), axis=-1, keepdims=True)  # (B, 1)
    return ops.sum(best, axis=1) / counts / temperature


def ensemble_scores(dense: Any, sparse: Any, colbert: Any) -> Any:
    """ensemble_score: dense + 0.3 sparse + ColBERT."""
    return dense + ENSEMBLE_SPARSE_WEIGHT * sparse + colbert


# --- losses over the scores ----------------------------------------------------------------------------


def cross_entropy(scores: Any, targets: Any) -> Any:
    """torch.nn.CrossEntropyLoss(reduction='mean'): mean over rows of -log_softmax(scores)[target]."""
    return ops.mean(cross_entropy_rows(scores, targets))


def cross_entropy_rows(scores: Any, targets: Any) -> Any:
    """F.cross_entropy(..., reduction='none'): (rows,)."""
    log_probs = ops.log_softmax(scores, axis=-1)
    picked = ops.take_along_axis(log_probs, ops.expand_dims(ops.cast(targets, "int32"), 1), axis=1)
    return -picked[:, 0]


def group_targets(rows: Any, group_size: int) -> Any:
    """arange(rows) * group_size: each query's own positive among all passages."""
    return ops.arange(rows, dtype="int32") * group_size


def local_scores(scores: Any, group_size: int) -> Any:
    """get_local_score: each query's own group, (B, G), from its (B, P) scores."""
    rows = ops.shape(scores)[0]
    offsets = ops.expand_dims(group_targets(rows, group_size), 1) + ops.expand_dims(
        ops.arange(group_size, dtype="int32"), 0
    )  # (B, G)
    return ops.take_along_axis(scores, offsets, axis=1)


def distill_kl_div(teacher_targets: Any, student_scores: Any) -> Any:
    """distill_loss('kl_div'): -mean(sum(log_softmax(student) * targets)); targets broadcast as in torch."""
    return -ops.mean(ops.sum(ops.log_softmax(student_scores, axis=-1) * teacher_targets, axis=-1))


def distill_m3_kd(teacher_targets: Any, student_scores: Any, group_size: int) -> Any:
    """distill_loss('m3_kd_loss'): for each group member i in turn, cross-entropy towards it with the
    members before it masked out (set to float32's min), weighted by the teacher's probability of it."""
    rows = ops.shape(student_scores)[0]
    columns = ops.shape(student_scores)[1]
    labels = group_targets(rows, group_size)
    loss = 0.0
    mask = ops.zeros_like(student_scores)
    for i in range(group_size):
        target = labels + i
        row_loss = cross_entropy_rows(student_scores + mask, target)
        loss = loss + ops.mean(teacher_targets[:, i] * row_loss)
        # torch.scatter(mask, -1, target, value=min): a set, not an add
        taken = ops.one_hot(target, columns, dtype=student_scores.dtype)
        mask = mask * (1.0 - taken) + taken * FLOAT32_MIN
    return loss


def in_batch_neg_loss(scores: Any, group_size: int, teacher_targets: Any | None, kd_loss_type: str) -> Any:
    """_compute_in_batch_neg_loss on ready (B, P) scores: every passage of the batch is a candidate."""
    targets = group_targets(ops.shape(scores)[0], group_size)
    if teacher_targets is None:
        return cross_entropy(scores, targets)
    if kd_loss_type == "kl_div":
        return distill_kl_div(teacher_targets, local_scores(scores, group_size)) + cross_entropy(
            scores, targets
        )
    return distill_m3_kd(teacher_targets, scores, group_size)


def no_in_batch_neg_loss(local: Any, teacher_targets: Any | None, kd_loss_type: str) -> Any:
    """_compute_no_in_batch_neg_loss on ready (B, G) local scores: each query's own group only.

    m3_kd_loss is refused before training (FlagEmbedding's indexes past the (B, G) scores there)."""
    if kd_loss_type == "m3_kd_loss" and teacher_targets is not None:
        raise ValueError(
            "m3_kd_loss needs in-batch negatives: use kd_loss_type 'kl_div' for no_in_batch_neg data"
        )
    zeros = ops.zeros((ops.shape(local)[0],), dtype="int32")
    loss = cross_entropy(local, zeros)
    if teacher_targets is not None:
        loss = distill_kl_div(teacher_targets, local) + loss
    return loss


# --- the whole loss ------------------------------------------------------------------------------------


def m3_loss(
    q: Representations,
    p: Representations,
    settings: LossSettings,
    *,
    step: Any,
    teacher_scores: Any | None = None,
    group_size: int,
    no_in_batch_neg: bool = False,
    devices: int = 1,
    negatives_cross_device: bool = False,
) -> dict[str, Any]:
    """EncoderOnlyEmbedderM3Model.forward's loss (training mode) and its terms, as scalars.

    group_size: passages per query (train_group_size). step: the number of training steps before this
    one (FlagEmbedding's `self.step`), a scalar tensor:
    self-distillation joins once step > self_distill_start_step. teacher_scores (B, G) raw teacher scores
    when knowledge distillation is on. Returns {"loss", "dense", ...}; a term not computed is absent.

    devices > 1: the batch is a data-parallel step's, `devices` equal blocks of rows (queries and their
    groups), one per device. Each block's terms are formed as FlagEmbedding's process forms them from its
    own batch, and averaged over the blocks as DDP averages the processes' gradients. With
    `negatives_cross_device` (and in-batch negatives) the dense term is the whole batch's instead: every
    query against every block's passages (FlagEmbedding's `_compute_cross_device_neg_loss`, targets
    arange(B) * G over the gathered rows); its sparse, ColBERT, ensemble and self-distillation terms stay
    per device there, and so they do here.
    """
    batch = ops.shape(q.dense)[0]
    teacher = None
    if teacher_scores is not None:
        teacher = ops.stop_gradient(ops.softmax(ops.reshape(teacher_scores, (batch, group_size)), axis=-1))
    cross_device = negatives_cross_device and devices > 1 and not no_in_batch_neg

    def block_terms(i: int) -> dict[str, Any]:
        rows = _block_rows(batch, devices, i)
        return _terms(
            _take_rows(q, rows),
            _take_rows(p, (rows[0] * group_size, rows[1] * group_size)),
            settings,
            None if teacher is None else teacher[rows[0] : rows[1]],
            group_size,
            no_in_batch_neg,
        )

    if devices == 1:
        terms = _terms(q, p, settings, teacher, group_size, no_in_batch_neg)
    elif cross_device and not settings.unified:
        terms = {}  # the dense term alone, and that is the whole batch's (below)
    else:
        blocks = [block_terms(i) for i in range(devices)]
        terms = {name: sum(b[name] for b in blocks) / devices for name in blocks[0]}
    if cross_device:
        terms["dense"] = _scores_loss(
            dense_scores(q.dense, p.dense, settings.temperature), group_size, teacher, settings, False
        )[1]
    return _with_total(terms, settings, step)


def _block_rows(batch: Any, devices: int, i: int) -> tuple[Any, Any]:
    """Rows [start, end) of block i of `devices` equal blocks."""
    size = batch // devices
    return i * size, (i + 1) * size


def _take_rows(side: Representations, rows: tuple[Any, Any]) -> Representations:
    start, end = rows
    values = {f.name: getattr(side, f.name) for f in fields(side)}
    return Representations(**{name: None if v is None else v[start:end] for name, v in values.items()})


def _scores_loss(
    scores: Any, group_size: int, teacher: Any | None, settings: LossSettings, no_in_batch_neg: bool
) -> tuple[Any, Any]:
    """(scores as the loss function returns them, loss): FlagEmbedding's compute_loss_func."""
    if no_in_batch_neg:
        local = local_scores(scores, group_size)
        return local, no_in_batch_neg_loss(local, teacher, settings.kd_loss_type)
    return scores, in_batch_neg_loss(scores, group_size, teacher, settings.kd_loss_type)


def _terms(
    q: Representations,
    p: Representations,
    settings: LossSettings,
    teacher: Any | None,
    group_size: int,
    no_in_batch_neg: bool,
) -> dict[str, Any]:
    """One batch's loss terms (one device's): dense, and with unified fine-tuning sparse, ColBERT, ensemble
    and the self-distillation loss (before the step decides whether it counts); no total."""
    temperature = settings.temperature

    def loss_of(scores: Any) -> tuple[Any, Any]:
        return _scores_loss(scores, group_size, teacher, settings, no_in_batch_neg)

    dense, dense_loss = loss_of(dense_scores(q.dense, p.dense, temperature))
    terms: dict[str, Any] = {"dense": dense_loss}
    if not settings.unified:
        return terms
    kd_type = settings.kd_loss_type
    batch = ops.shape(q.dense)[0]
    sparse, sparse_loss = loss_of(sparse_scores(q, p, temperature))
    colbert, colbert_loss = loss_of(colbert_scores(q, p, temperature))
    ensemble = ensemble_scores(dense, sparse, colbert)
    if no_in_batch_neg:
        # FlagEmbedding scores the ensemble against the positives alone here: one candidate per query,
        # whose cross-entropy (and kl_div) is 0; its self-distillation targets are then all ones.
        ensemble = ops.zeros((batch, 1), dtype=ensemble.dtype)
        ensemble_loss = no_in_batch_neg_loss(ensemble, None if teacher is None else teacher[:, :1], kd_type)
    else:
        ensemble_loss = in_batch_neg_loss(ensemble, group_size, teacher, kd_type)
    terms |= {"sparse": sparse_loss, "colbert": colbert_loss, "ensemble": ensemble_loss}
    if settings.self_distill:
        targets = ops.softmax(ops.stop_gradient(ensemble), axis=-1)
        terms["self_distill"] = (
            distill_kl_div(targets, dense)
            + SPARSE_LOSS_WEIGHT * distill_kl_div(targets, sparse)
            + distill_kl_div(targets, colbert)
        ) / 3
    return terms


def _with_total(terms: dict[str, Any], settings: LossSettings, step: Any) -> dict[str, Any]:
    """The terms with the total loss (linear in them, so the mean of the devices' totals is the total of
    their mean terms); self-distillation counts once step > self_distill_start_step."""
    if not settings.unified:
        return terms | {"loss": terms["dense"]}
    loss = (terms["dense"] + terms["ensemble"] + SPARSE_LOSS_WEIGHT * terms["sparse"] + terms["colbert"]) / 4
    if settings.self_distill:
        distill = terms["self_distill"]
        active = ops.greater(step, settings.self_distill_start_step)
        terms["self_distill"] = ops.where(active, distill, ops.zeros_like(distill))
        loss = ops.where(active, (loss + distill) / 2, loss)
    terms["loss"] = loss
    return terms
