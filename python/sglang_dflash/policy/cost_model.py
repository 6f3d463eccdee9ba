"""Step cost model: seconds of one decode step at batch size bs and verify width W.

`CostModel` is fitted from a start-up profile of the target and drafter
forwards (`from_profile`) and corrected online from measured step times; the
speculation policy (controller.py) divides expected commits by its predictions.
Host-side stdlib arithmetic only: nothing here touches a device tensor.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from typing import Any

from sglang_dflash.checks import is_finite, is_int
from sglang_dflash.policy.config import policy_error


def bucket_of(bs: int) -> int:
    """The batch-size bucket of `bs`: the octave (2^(b-1), 2^b]; bucket 0 is batch 1.

    Why octaves that end at a power of two: a saturated load runs at its cap
    (a power of two in practice) and dips a few requests below it while
    finished requests are replaced; octaves starting at a power of two split
    such a load across two buckets, each learning from part of the samples."""
    return (bs - 1).bit_length()


def bucket_range(bucket: int) -> tuple[int, int]:
    """The smallest and largest batch size of a bucket."""
    return (1, 1) if bucket == 0 else ((1 << (bucket - 1)) + 1, 1 << bucket)


class _Curve:
    """Monotone piecewise-linear y(x) through per-x averaged knots.

    Knot values are made non-decreasing by a running min from the right (a
    larger batch never costs less): an upward timing spike at one knot (a busy
    host during the start-up profile) is replaced by a larger knot's value
    instead of being propagated to every larger knot, as a running max from
    the left would. Below the first knot the curve is flat (fixed overheads
    dominate tiny batches); above the last it continues with the last
    segment's slope, or proportionally to x with a single knot.
    """

    __slots__ = ("xs", "ys")

    def __init__(self, points: Iterable[tuple[float, float]]) -> None:
        groups: dict[float, list[float]] = {}
        for x, y in points:
            groups.setdefault(float(x), []).append(float(y))
        self.xs = sorted(groups)
        self.ys, running = [], math.inf
        for x in reversed(self.xs):
            running = min(running, math.fsum(groups[x]) / len(groups[x]))
            self.ys.append(running)
        self.ys.reverse()

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            if len(xs) == 1:
                return ys[0] * x / xs[0]
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            return ys[-1] + slope * (x - xs[-1])
        i = bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _parse_sample(i: int, s: Any) -> tuple[int, int, bool, float]:
    try:
        bs, q, drafted, sec = s
    except (TypeError, ValueError):
        raise policy_error(f"profile sample {i} = {s!r} must be (bs, tokens_per_request, drafted, "
                    "seconds)") from None
    ok = (is_int(bs) and bs >= 1 and is_int(q) and q >= 1 and isinstance(drafted, bool)
          and is_finite(sec) and sec > 0)
    if not ok:
        raise policy_error(f"profile sample {i} = {s!r}: need int bs >= 1, int tokens_per_request "
                    ">= 1, bool drafted, finite seconds > 0")
    return int(bs), int(q), drafted, float(sec)


MIN_SCALE = 0.2  # lower bound of the online scale on the profiled compute
# Prior spread (sd of the log factor) of one W > 0 width's own cost deviation
# from what its bucket's W > 0 widths share: a few percent, the part of a
# width's cost the affine fit of the profile misses (`CostModel._shared`).
WIDTH_SPREAD = 0.03


class _AffineFit:
    """Exponentially forgetting least squares of y = F + G * 1{W>0} + s * x for one bucket.

    x is the profiled step cost, y the measured one. F is what the profile
    cannot see and every step pays (scheduler, Python, sampling, launches); G
    what only a speculative step pays beyond its profiled drafter (draft
    launch, verify bookkeeping); s scales the profiled compute. Why G: a
    speculation-only overhead fitted into F or s charged W = 0 for it too (on a
    loaded GPU plain decoding looked 1.4x dearer than measured) and inflated
    the wide widths. Each class of steps (W = 0, W > 0) forgets only by its own
    steps, so a long stretch of one does not erase what the other measured.

    Priors: s = 1 with `prior_weight` pseudo-steps (at the bucket's typical x),
    so a bucket seen at one width keeps the profile's width-to-width
    differences; G = `g0` (the nearest bucket's) with 1/20 of that, so one
    step of each kind outweighs it; F = `f0` 100x weaker still. A bucket
    without W = 0 steps thus puts the W > 0 gap in F (what a CPU server's
    scheduler costs every width), one without W > 0 steps gives them G = g0.
    """

    __slots__ = ("sums", "sbs", "nbs", "steps")

    def __init__(self) -> None:
        self.sums = [[0.0] * 5, [0.0] * 5]  # per class (W = 0, W > 0): n, sx, sy, sxx, sxy
        self.sbs = self.nbs = 0.0
        self.steps = 0

    def add(self, x: float, y: float, bs: int, keep: float, spec: bool) -> None:
        s = self.sums[spec]
        for i, v in enumerate((1.0, x, y, x * x, x * y)):
            s[i] = s[i] * keep + v
        self.nbs = self.nbs * keep + 1.0
        self.sbs = self.sbs * keep + bs
        self.steps += 1

    def cap(self, spec: bool, weight: float) -> None:
        """Scale one class's sums down to at most `weight` steps."""
        s = self.sums[spec]
        if s[0] > weight:
            k = weight / s[0]
            s[:] = [v * k for v in s]

    def solve(self, prior_weight: float, f0: float, g0: float) -> tuple[float, float, float]:
        """(F, G, s) minimizing the forgetting squared error plus the priors,
        constrained to F >= 0, F + G >= 0 and s >= MIN_SCALE: a step never
        costs less than nothing, and an unconstrained fit of noisy steps at
        nearby widths can tip F negative, after which predictions (and the
        outlier clip that is relative to them) run away."""
        (n0, sx0, sy0, sxx0, sxy0), (n1, sx1, sy1, sxx1, sxy1) = self.sums
        xbar = (sx0 + sx1) / (n0 + n1)
        kg = prior_weight / 20.0
        kf = kg / 100.0
        ks = prior_weight * xbar * xbar
        # Normal equations in (F, H = F + G, s), whose bounds are F, H >= 0.
        a = [[n0 + kf + kg, -kg, sx0], [-kg, n1 + kg, sx1], [sx0, sx1, sxx0 + sxx1 + ks]]
        b = [sy0 + kf * f0 - kg * g0, sy1 + kg * g0, sxy0 + sxy1 + ks]
        lower = (0.0, 0.0, MIN_SCALE)
        theta = _solve(a, b)
        if theta is not None and all(t >= lo for t, lo in zip(theta, lower)):
            return theta[0], theta[1] - theta[0], theta[2]  # the usual case: no bound active
        best, best_obj = None, math.inf
        for fixed in range(1, 8):  # every active set: the feasible candidate of least cost wins
            theta = [lower[i] if fixed >> i & 1 else 0.0 for i in range(3)]
            free = [i for i in range(3) if not fixed >> i & 1]
            if free:
                sol = _solve([[a[i][j] for j in free] for i in free],
                             [b[i] - sum(a[i][j] * theta[j] for j in range(3) if fixed >> j & 1)
                              for i in free])
                if sol is None:
                    continue
                for i, v in zip(free, sol):
                    theta[i] = v
            if any(theta[i] < lower[i] - 1e-15 for i in range(3)):
                continue
            obj = sum(theta[i] * (sum(a[i][j] * theta[j] for j in range(3)) - 2.0 * b[i])
                      for i in range(3))
            if obj < best_obj:
                best, best_obj = theta, obj
        f, h, scale = best
        return f, h - f, scale

    def mean_bs(self) -> float:
        return self.sbs / self.nbs


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a x = b by Gaussian elimination with partial pivoting (n <= 3); None if singular."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, n):
            k = m[r][c] / m[c][c]
            for j in range(c, n + 1):
                m[r][j] -= k * m[c][j]
    x = [0.0] * n
    for c in range(n - 1, -1, -1):
        x[c] = (m[c][n] - sum(m[c][j] * x[j] for j in range(c + 1, n))) / m[c][c]
    return x


class CostModel:
    """Seconds of one decode step: t(bs, W) = F_b + 1{W>0} G_b + s_b * [V(bs, W+1) + 1{W>0} D(bs)].

    The bracket is the start-up profile (`base`):
    * V(bs, q), the target forward at q tokens per request, is a table
      interpolation of the undrafted profile samples: one monotone
      piecewise-linear curve in bs per profiled q, linearly interpolated between
      profiled q (on running-min-from-the-right values, so V is non-decreasing
      in q and robust to upward timing spikes). Outside
      the profiled q range it assumes cost depends on total tokens bs*q:
      V(bs, q) = V_{q0}(bs * q / q0) for the nearest profiled q0. A profile with
      only q = 1 therefore is piecewise-linear in total tokens.
    * D(bs), the drafter forward (roughly proportional to bs, independent of W
      since it always drafts the full block), is a monotone piecewise-linear
      curve of the drafted samples' residuals seconds - V(bs, q), clamped >= 0.

    (F_b, G_b, s_b) is learned online from measured step times, per batch-size
    bucket b = `bucket_of(bs)` (`_AffineFit`): F_b is the per-step cost the
    profile does not see (on a CPU server the scheduler's own work is a large
    share of a small model's step, and it does not grow with W), G_b what a
    speculative step pays beyond that and its profiled drafter, s_b corrects
    the profiled compute. A bucket without observations borrows the nearest
    observed bucket's (F, G, s), F scaled per request when it lies above it
    (`_borrowed`); with none at all the model is the profile.
    Each observed (bucket, W) cell also keeps its own measured / profiled
    factor, which dominates that cell's prediction after a few steps
    (n / (n + prior_weight)): the widths actually run are predicted as
    measured, however far off the profile is there; the affine fit is only
    the extrapolation to widths not run yet. A cell's learning rate follows
    its weight aged by the steps since its last sample, so widths measured
    only by rare probes track recent measurements. The W > 0 cells of a
    bucket share their residual over the affine fit; each keeps its own
    deviation from the shared one in proportion to how well its samples
    resolve it against the bucket's step noise (`_shared`).
    Why affine and not a multiplicative correction: a fixed overhead learned as
    a factor on the profile inflates the wide widths' predicted cost by the
    same factor, which turned speculation off where it paid.

    With `pad_batch=True` a batch size is first rounded up to the next profiled
    batch size (unchanged beyond the largest): when the profile holds exactly
    the captured CUDA-graph sizes, this is the padding a replay really pays,
    where linear interpolation between sizes would be optimistic.
    """

    def __init__(self, verify: Mapping[int, _Curve], draft: _Curve, *, ema: float = 0.05,
                 prior_weight: float = 1.0, outlier_ratio: float = 3.0,
                 pad_batch: bool = False) -> None:
        self._qs = sorted(verify)
        self._verify = [verify[q] for q in self._qs]
        self._draft = draft
        self._padded_sizes = sorted({int(x) for c in self._verify for x in c.xs}
                                    | {int(x) for x in draft.xs}) if pad_batch else []
        # The affine fit extrapolates to widths not run lately, so it forgets 4x
        # slower than the cells: a stretch at one width must not drag it away.
        self.keep = 1.0 - float(ema) / 4.0
        self.prior_weight = float(prior_weight)
        self.outlier_ratio = float(outlier_ratio)
        self._base_cache: dict[tuple[int, int], float] = {}
        self.ema = float(ema)
        self._fits: dict[int, _AffineFit] = {}  # bucket -> fit
        self._params: dict[int, tuple] = {}  # bucket -> (F, G, s, per request), cached
        self._own: dict[int, tuple[float, float, float]] = {}  # bucket -> its own (F, G, s), cached
        # (bucket, W) -> [log residual, aged weight, step of the last sample, samples,
        #                 EW variance of the log samples around the residual]
        self._cells: dict[tuple[int, int], list[float]] = {}
        self._shared_cache: dict[int, dict[int, float]] = {}  # bs -> {W > 0: log shift}
        self.cell_keep = 1.0 - float(ema) / 16.0  # per observed step: time constant 16 / ema steps
        self._step = 0  # observed steps, the clock that ages cells

    @classmethod
    def from_profile(cls, samples: Iterable[Any], **options: Any) -> CostModel:
        """Fit from measured `(bs, tokens_per_request, drafted, seconds)` samples.

        Needs at least one undrafted and one drafted sample. Best: undrafted
        samples at every candidate q = W+1 for several batch sizes (e.g. the
        captured CUDA-graph sizes), and drafted ones at those batch sizes.
        `options` takes the keyword arguments `ema`, `prior_weight`,
        `outlier_ratio`, `pad_batch`.
        """
        parsed = [_parse_sample(i, s) for i, s in enumerate(samples)]
        plain: dict[int, list[tuple[int, float]]] = {}
        for bs, q, drafted, sec in parsed:
            if not drafted:
                plain.setdefault(q, []).append((bs, sec))
        if not plain or all(not p[2] for p in parsed):
            raise policy_error("cost profile needs at least one undrafted and one drafted sample "
                        "(the draft term is their difference)")
        verify = {q: _Curve(pts) for q, pts in plain.items()}
        fit = cls(verify, _Curve([(1, 0.0)]))  # residuals at the samples' own bs: no padding
        draft = _Curve([(bs, max(sec - fit._verify_cost(bs, q), 0.0))
                        for bs, q, drafted, sec in parsed if drafted])
        return cls(verify, draft, **options)

    def _verify_cost(self, bs: int, q: int) -> float:
        qs, curves = self._qs, self._verify
        if q <= qs[0]:
            return curves[0](bs * q / qs[0])
        values = [c(bs) for c in curves]
        for k in range(len(values) - 2, -1, -1):  # running min from the right, as in _Curve
            values[k] = min(values[k], values[k + 1])
        for k in range(1, len(qs)):
            if q <= qs[k]:
                lam = (q - qs[k - 1]) / (qs[k] - qs[k - 1])
                return values[k - 1] + lam * (values[k] - values[k - 1])
        return max(values[-1], curves[-1](bs * q / qs[-1]))

    def base(self, bs: int, width: int) -> float:
        """Profiled seconds (no online correction); cached per (bs, W)."""
        key = (bs, width)
        t = self._base_cache.get(key)
        if t is None:
            sizes = self._padded_sizes
            if sizes and bs < sizes[-1]:
                bs = sizes[bisect_right(sizes, bs - 1)]  # smallest profiled size >= bs
            t = self._verify_cost(bs, width + 1) + (self._draft(bs) if width > 0 else 0.0)
            if len(self._base_cache) > 65536:  # NOTE: bounded; bs values are few in practice
                self._base_cache.clear()
            self._base_cache[key] = t = max(t, 1e-9)
        return t

    def _nearest(self, bucket: int, exclude: int | None = None) -> int | None:
        """The observed bucket nearest to `bucket` other than `exclude` (the
        smaller one on a tie), or None."""
        others = [b for b in self._fits if b != exclude]
        return min(others, key=lambda b: (abs(b - bucket), b)) if others else None

    def params(self, bs: int) -> tuple[float, float]:
        """(F seconds, scale s) of the online fit at this batch size."""
        f, _, scale = self._at(bs)
        return f, scale

    def spec_overhead(self, bs: int) -> float:
        """G seconds: what a W > 0 step pays at this batch size beyond F and its profile."""
        return self._at(bs)[1]

    def _at(self, bs: int) -> tuple[float, float, float]:
        f, g, scale, per_request = self._bucket_params(bucket_of(bs))
        return (f * bs if per_request else f), g, scale

    def _bucket_params(self, bucket: int) -> tuple[float, float, float, bool]:
        """(F, G, s, per_request) of a bucket, cached; with per_request, F is
        seconds per request in the batch (borrowed upward, `_borrowed`)."""
        cached = self._params.get(bucket)
        if cached is not None:
            return cached
        if bucket in self._fits:
            near = self._nearest(bucket, exclude=bucket)
            f0 = g0 = 0.0
            if near is not None:  # the borrowed F at the bucket's smallest batch, and G
                f0, g0, _, per_request = self._borrowed(bucket, near)
                f0 *= bucket_range(bucket)[0] if per_request else 1
            value = (*self._fits[bucket].solve(self.prior_weight, f0, g0), False)
        else:
            near = self._nearest(bucket)
            value = self._borrowed(bucket, near) if near is not None else (0.0, 0.0, 1.0, False)
        self._params[bucket] = value
        return value

    def _borrowed(self, bucket: int, near: int) -> tuple[float, float, float, bool]:
        """The observed bucket `near`'s (F, G, s, per_request) for use at
        `bucket`: above `near`, F per request of near's mean batch
        (per_request = True); below it, F as it is. G, a per-step cost of
        speculating (launches, bookkeeping), as it is.

        Why per request upward: most of what the profile (the dense layers)
        misses grows with the batch: the scheduler's per-request work, the
        attention over each request's own context. On the CPU demo server a
        W = 0 step took 20 / 34 / 81 ms at batch 16 / 32 / 64 (math, a grid's
        off server); borrowing the bs-32 bucket's F unscaled predicted 42 ms
        at batch 64, put W = 7 at 8.6x W = 0 (measured ~4x) and turned
        speculation off for 43 steps where it ran 1.4x ahead of off. Downward
        F stays: part of it is per step, and erring high on the cost of W = 0
        errs toward speculation, where a smaller batch leaves it room (and the
        bucket's own steps correct it within a few)."""
        f, g, scale = self.params_of(near)
        if bucket <= near:
            return f, g, scale, False
        return f / self._fits[near].mean_bs(), g, scale, True

    def params_of(self, bucket: int) -> tuple[float, float, float]:
        """(F, G, s) solved from one observed bucket's own data alone (priors F = G = 0), cached."""
        own = self._own.get(bucket)
        if own is None:
            own = self._own[bucket] = self._fits[bucket].solve(self.prior_weight, 0.0, 0.0)
        return own

    def observed(self, bs: int, width: int) -> bool:
        """Whether a step at this width was timed in bs's bucket."""
        return (bucket_of(bs), width) in self._cells

    def correction(self, bs: int, width: int) -> float:
        """Current predicted / profiled seconds at (bs, W)."""
        return self.predict(bs, width) / self.base(bs, width)

    def _affine(self, bs: int, width: int) -> float:
        f, g, scale = self._at(bs)
        return max(f + (g if width > 0 else 0.0) + scale * self.base(bs, width), 1e-9)

    def predict(self, bs: int, width: int) -> float:
        """Predicted seconds of one step at batch size bs and verify width W.

        An observed (bucket, W) cell predicts from its own measurements
        (profiled base x the cell's learned factor), blended with the affine
        fit by n / (n + prior_weight); an unobserved cell uses the fit alone.
        """
        aff = self._affine(bs, width)
        cell = self._cells.get((bucket_of(bs), width))
        if cell is None:
            return aff
        if width > 0:
            return aff * math.exp(self._shared(bs)[width])
        lam = cell[3] / (cell[3] + self.prior_weight)  # samples seen, not their aged weight
        return aff * math.exp(lam * self._residual(bs, width, cell))

    def _residual(self, bs: int, width: int, cell: list[float]) -> float:
        """A cell's log factor over the affine fit's prediction at bs."""
        return cell[0] - math.log(self._affine(bs, width) / self.base(bs, width))

    def _shared(self, bs: int) -> dict[int, float]:
        """Log factor over the affine fit of every observed W > 0 cell of bs's
        bucket: the cells' weighted mean residual r (shrunk by
        N / (N + prior_weight), N their samples), plus each cell's own
        deviation from r weighted t^2 / (t^2 + v / n): t = WIDTH_SPREAD, v the
        bucket's step-to-step variance, n the cell's effective samples.

        Why pool: the W > 0 widths differ only in the verify's tokens, often
        nearly free, but each cell sees its own few noisy samples; unpooled,
        the width whose probe happened to land fast looked cheapest and won
        (the winner's curse). A width measured well still gets its own cost
        (v / n -> 0).
        """
        cached = self._shared_cache.get(bs)
        if cached is not None:
            return cached
        bucket = bucket_of(bs)
        n_cap = 2.0 / self.ema - 1.0  # the effective samples of an EMA at rate ema
        cells = {w: (self._residual(bs, w, c), min(self.cell_weight(bs, w), n_cap), c[3], c[4])
                 for (b, w), c in self._cells.items() if b == bucket and w > 0}
        total = math.fsum(n for _, n, _, _ in cells.values())
        samples = math.fsum(k for _, _, k, _ in cells.values())
        if total > 0:
            mean = math.fsum(r * n for r, n, _, _ in cells.values()) / total
            var = math.fsum(v * n for _, n, _, v in cells.values()) / total
        else:  # every cell aged to nothing: share nothing
            mean = var = 0.0
        lam = samples / (samples + self.prior_weight)
        tau2 = WIDTH_SPREAD * WIDTH_SPREAD
        shared = {}
        for w, (r, n, _, _) in cells.items():
            own = tau2 / (tau2 + var / n) if n > 0 else 0.0
            shared[w] = lam * mean + own * (r - mean) if total > 0 else lam * r
        if len(self._shared_cache) > 4096:  # NOTE: bounded; bs values are few in practice
            self._shared_cache.clear()
        self._shared_cache[bs] = shared
        return shared

    def observe(self, bs: int, width: int, seconds: float) -> None:
        """Learn from one measured decode step.

        The cell keeps the mean of log(measured / profiled) (an EMA after
        1/ema steps); from its fourth step on, a measurement is clipped to
        `outlier_ratio` of the cell's own estimate (a GC pause, another
        process); before that to outlier_ratio**2 of the model's prediction,
        which may be far off (a profile taken on a busy host) and must not
        stop the data from correcting it.
        """
        if not (is_finite(seconds) and seconds > 0):
            raise policy_error(f"step_seconds = {seconds!r} must be a finite number > 0")
        bucket = bucket_of(bs)
        base = self.base(bs, width)
        self._step += 1
        self._shared_cache.clear()  # the clock moved (cells age), a cell may be new
        cell = self._cells.setdefault((bucket, width), [0.0, 0.0, self._step, 0, 0.0])
        # Age the cell's weight by the steps since its last sample (time
        # constant 16 / ema steps): a width measured every step keeps the ema
        # window, one measured only by rare probes (every 50-200 steps) gives
        # each new sample a weight of ~0.2-0.4, so one disturbed stretch
        # (another process on the host) cannot bias it for thousands of steps.
        cell[1] *= self.cell_keep ** (self._step - cell[2])
        cell[2] = self._step
        cell[3] += 1
        log_ratio = math.log(seconds / base)
        if cell[3] > 3:  # around the cell's own estimate
            clip = math.log(self.outlier_ratio)
            center = cell[0]
        else:  # around the model's prediction, with the squared (wider) ratio
            clip = 2.0 * math.log(self.outlier_ratio)
            center = math.log(self.predict(bs, width) / base)
        log_ratio = min(max(log_ratio, center - clip), center + clip)
        cell[1] += 1.0
        rate = max(self.ema, 1.0 / cell[1])  # a mean until 1/ema steps
        delta = log_ratio - cell[0]
        cell[0] += rate * delta
        cell[4] = (1.0 - rate) * (cell[4] + rate * delta * delta)  # EW variance, same rate
        fit = self._fits.get(bucket)
        if fit is None:
            fit = self._fits[bucket] = _AffineFit()
        fit.add(base, base * math.exp(log_ratio), bs, self.keep, width > 0)
        self._params.clear()  # neighbours borrow from this bucket
        self._own.pop(bucket, None)
        self._shared_cache.clear()

    def forget(self, bs: int, width: int, weight: float) -> None:
        """Cap the aged weight of bs's (bucket, W) cell at `weight`, so its
        next samples move the estimate most of the way (a load's cost differs
        from another's at the same batch size: its contexts are longer or
        shorter); the fit's steps of that class likewise."""
        bucket = bucket_of(bs)
        cell = self._cells.get((bucket, width))
        if cell is not None:
            cell[1], cell[2] = min(self.cell_weight(bs, width), weight), self._step
            self._fits[bucket].cap(width > 0, weight)
            self._params.clear()
            self._own.pop(bucket, None)
            self._shared_cache.clear()

    def cell_weight(self, bs: int, width: int) -> float:
        """Aged weight of bs's (bucket, W) cell now: about its samples of the
        last 16 / ema observed steps (0 if never observed)."""
        cell = self._cells.get((bucket_of(bs), width))
        if cell is None:
            return 0.0
        return cell[1] * self.cell_keep ** (self._step - cell[2])

    def has_observations(self) -> bool:
        """Whether any step time has been observed (in any bucket)."""
        return bool(self._fits)

    def bucket_batch_sizes(self) -> list[int]:
        """The mean batch size of every observed batch-size bucket, by bucket."""
        return [max(1, round(self._fits[b].mean_bs())) for b in sorted(self._fits)]

    def snapshot(self) -> dict:
        """JSON-serializable state of the online fit, per observed bucket."""
        buckets = {}
        for b in sorted(self._fits):
            lo, hi = bucket_range(b)
            f, g, scale = self._at(lo)
            fit = self._fits[b]
            buckets[f"bs{lo}-{hi}"] = {
                "overhead_ms": round(f * 1e3, 3), "spec_overhead_ms": round(g * 1e3, 3),
                "scale": round(scale, 4),
                "steps": fit.steps, "mean_bs": round(fit.mean_bs(), 1)}
        cells = {f"bucket{b}/w{w}": {"measured/profiled": round(math.exp(c[0]), 4), "steps": int(c[3]),
                                     "weight": round(c[1], 2)}
                 for (b, w), c in sorted(self._cells.items())}
        return {"buckets": buckets, "cells": cells}
