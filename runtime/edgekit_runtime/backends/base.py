"""The interface every inference backend implements.

Public methods check state and inputs, then call the backend's ``_load_impl`` / ``_infer_impl`` /
``_close_impl``. A runner is a context manager: ``with runner: runner.infer(feeds)``.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, NamedTuple

import numpy as np

from edgekit_runtime.errors import BackendError
from edgekit_runtime.signature import IOSignature

logger = logging.getLogger(__name__)


#: ``run(output_names, feeds, run_options)`` -> the outputs in the order of ``output_names`` (feeds: a ``dict``).
CompiledCall = Callable[[list[str], dict[str, np.ndarray], Any], Sequence[np.ndarray]]
#: ``recover(feeds, error)`` -> the outputs after all, or raises the error that explains the failure.
Recovery = Callable[[dict[str, np.ndarray], Exception], Sequence[np.ndarray]]


class CompiledRun(NamedTuple):
    """A runner's model as one call on validated feeds, in ONNX Runtime's compiled calling convention:
    ``run(output_names, feeds, None)`` takes a ``dict`` of feeds and returns the outputs as a list, in
    the order of ``output_names``. When ``run`` raises, ``recover(feeds, error)`` either returns the
    outputs (after, say, moving to a fallback execution provider, which replaces ``run``: ask the runner
    for a new CompiledRun) or raises the :class:`BackendError` that explains the failure.

    The serving path calls ``run`` itself rather than through a method of the runner: for a small
    model each Python frame per request costs a fraction of a percent of throughput.
    """

    run: CompiledCall
    output_names: list[str]
    recover: Recovery


def _reraise(feeds: dict[str, np.ndarray], error: Exception) -> Sequence[np.ndarray]:
    """The default ``recover``: nothing to fall back to, the runner's own error stands."""
    raise error


class Runner(abc.ABC):
    """Loads one model for one backend and runs it on feeds that match its :class:`IOSignature`."""

    #: The registry name of the backend (``"onnxruntime"``, ``"tensorrt"``).
    backend_name: ClassVar[str]

    def __init__(self, signature: IOSignature) -> None:
        self._signature = signature
        self._loaded = False

    # -- public API ---------------------------------------------------------------------------

    @property
    def signature(self) -> IOSignature:
        return self._signature

    @property
    def is_loaded(self) -> bool:
        return self._loaded

    @property
    def concurrent_calls_safe(self) -> bool:
        """Whether calls from several threads may run at once, each getting its own answer (ONNX Runtime's
        ``session.run``, OpenVINO's pool of infer requests). False where calls share buffers, a binding or a
        stream: such a runner serialises its own calls, and a server runs it on one instance only (more would
        only queue at its lock). The default is the safe answer, False."""
        return False

    @property
    def providers(self) -> tuple[str, ...]:
        """What really runs the model once loaded (for ONNX Runtime: the session's providers)."""
        self._require_loaded("providers")
        return self._providers_impl()

    def load(self) -> Runner:
        """Load the model; a second call does nothing. Returns ``self`` for chaining."""
        if not self._loaded:
            self._load_impl()
            self._loaded = True
            logger.debug("%s runner loaded with providers %s", self.backend_name, self._providers_impl())
        return self

    def infer(self, feeds: Mapping[str, np.ndarray], *, validate: bool = True) -> dict[str, np.ndarray]:
        """Run the model; returns arrays keyed by output name, in signature order.

        ``validate=False`` skips the signature check; only for timing loops whose feeds were
        already validated once.
        """
        if not self._loaded:  # inline: this runs on every request, a method call is not free
            self._require_loaded("infer")
        if validate:
            self._signature.feed_validator(feeds)  # validate_feeds, compiled once per signature
        return self._infer_impl(feeds)

    def compiled_run(self) -> CompiledRun:
        """How a server that validates every request against :attr:`signature` itself runs the model with
        the fewest Python frames in between (see :class:`CompiledRun`). It must stop calling it before it
        closes the runner, and ask again after ``recover`` returns. Backends with a compiled call of their
        own return it; this default goes through ``_infer_impl``."""
        self._require_loaded("compiled_run")
        infer = self._infer_impl

        def run(output_names: list[str], feeds: dict[str, np.ndarray], run_options: Any) -> list[np.ndarray]:
            outputs = infer(feeds)
            return [outputs[name] for name in output_names]

        return CompiledRun(run, list(self._signature.output_names), _reraise)

    def close(self) -> None:
        """Release the model; safe to call twice."""
        if self._loaded:
            try:
                self._close_impl()
            finally:
                self._loaded = False

    def __enter__(self) -> Runner:
        return self.load()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- construction from a bundle -------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def from_bundle(cls, bundle: Any, **overrides: Any) -> Runner:
        """Build a runner from a :class:`~edgekit_runtime.bundle.Bundle`'s ``backend`` section;
        ``overrides`` replace constructor arguments (e.g. ``intra_op_threads=1``)."""

    # -- implementation hooks -------------------------------------------------------------------

    @abc.abstractmethod
    def _load_impl(self) -> None: ...

    @abc.abstractmethod
    def _infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def _close_impl(self) -> None: ...

    @abc.abstractmethod
    def _providers_impl(self) -> tuple[str, ...]: ...

    def _require_loaded(self, what: str) -> None:
        if not self._loaded:
            raise BackendError(
                f"{type(self).__name__}.{what}: the model is not loaded",
                hint="call runner.load() first, or use the runner as a context manager: `with runner:`",
            )
