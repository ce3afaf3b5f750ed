"""Which functions serve a SageMaker model: the toolkit's resolution rules."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ferry.handlers.sagemaker.functions import (
    Defaults,
    call,
    import_user_module,
    program_module,
    resolve,
)


def _default(name: str) -> Any:
    def function(*args: Any) -> Any:
        return (name, *args)

    function.__name__ = name
    return function


DEFAULTS = Defaults(
    model_fn=lambda model_dir: ("default_model_fn", model_dir),
    input_fn=lambda data, content_type: ("in", data),
    predict_fn=lambda data, model: ("predicted", data, model),
    output_fn=lambda prediction, accept: ("out", prediction, accept),
)


def _module(**functions: Any) -> ModuleType:
    module = ModuleType("inference")
    for name, function in functions.items():
        setattr(module, name, function)
    return module


def test_without_a_module_every_function_is_a_default() -> None:
    functions = resolve(None, DEFAULTS)
    assert functions.model_fn is DEFAULTS.model_fn
    assert functions.pre_model_fn is None and functions.model_warmup_fn is None
    # The default transform_fn runs input_fn, predict_fn and output_fn in turn.
    result = call(functions.transform_fn, ("M", "body", "application/json", "text/csv"), None)
    assert result == ("out", ("predicted", ("in", "body"), "M"), "text/csv")


def test_the_modules_functions_replace_the_defaults_one_by_one() -> None:
    def predict_fn(data: Any, model: Any) -> Any:
        return f"mine({data})"

    functions = resolve(_module(predict_fn=predict_fn), DEFAULTS)
    assert functions.predict_fn is predict_fn
    assert functions.input_fn is DEFAULTS.input_fn
    result = call(functions.transform_fn, ("M", "b", "ct", "acc"), None)
    assert result == ("out", "mine(('in', 'b'))", "acc")


def test_a_transform_fn_is_called_as_is() -> None:
    def transform_fn(model: Any, data: Any, content_type: str, accept: str) -> Any:
        return "whole", "text/plain"

    functions = resolve(_module(transform_fn=transform_fn), DEFAULTS)
    assert functions.transform_fn is transform_fn


@pytest.mark.parametrize("other", ["input_fn", "predict_fn", "output_fn"])
def test_transform_fn_beside_any_of_the_three_is_refused(other: str) -> None:
    module = _module(transform_fn=lambda m, d, c, a: None, **{other: lambda a, b: None})
    with pytest.raises(ValueError, match="transform_fn"):
        resolve(module, DEFAULTS)


def test_hooks_before_and_after_model_fn_are_picked_up() -> None:
    def pre_model_fn(model_dir: str) -> None: ...

    def model_warmup_fn(model_dir: str, model: Any) -> None: ...

    functions = resolve(
        _module(pre_model_fn=pre_model_fn, model_warmup_fn=model_warmup_fn), DEFAULTS
    )
    assert functions.pre_model_fn is pre_model_fn
    assert functions.model_warmup_fn is model_warmup_fn


def test_a_non_callable_attribute_of_that_name_is_not_a_function() -> None:
    functions = resolve(_module(model_fn="not a function"), DEFAULTS)
    assert functions.model_fn is DEFAULTS.model_fn


def test_a_function_with_one_more_parameter_gets_the_context_last() -> None:
    def with_context(data: Any, content_type: str, context: Any) -> Any:
        return data, content_type, context

    assert call(with_context, ("d", "t"), "CTX") == ("d", "t", "CTX")
    assert call(lambda data, content_type: (data, content_type), ("d", "t"), "CTX") == ("d", "t")


def test_defaulted_parameters_count_as_the_toolkit_counts_them() -> None:
    def model_fn(model_dir: str, context: Any = None) -> Any:
        return context

    assert call(model_fn, ("/m",), "CTX") == "CTX"


def test_any_other_parameter_count_is_a_type_error_naming_the_function() -> None:
    def input_fn(a: Any, b: Any, c: Any, d: Any) -> None: ...

    with pytest.raises(TypeError, match="input_fn takes 4 parameters; the toolkit passes 2"):
        call(input_fn, ("d", "t"), None)


def test_sagemaker_program_names_the_module_with_or_without_py() -> None:
    assert program_module({}) == "inference"
    assert program_module({"SAGEMAKER_PROGRAM": "mnist.py"}) == "mnist"
    assert program_module({"SAGEMAKER_PROGRAM": "serve_mod"}) == "serve_mod"


def test_the_user_module_imports_from_code_with_its_siblings(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "helpers_for_sm_test.py").write_text("VALUE = 41\n")
    (code / "sm_program_test.py").write_text(
        "from helpers_for_sm_test import VALUE\n\ndef model_fn(model_dir):\n    return VALUE + 1\n"
    )
    try:
        module = import_user_module(code, "sm_program_test")
        assert module is not None and module.model_fn("/m") == 42
        assert import_user_module(code, "no_such_program_for_sm_test") is None
    finally:
        sys.path.remove(str(code))
        sys.modules.pop("sm_program_test", None)
        sys.modules.pop("helpers_for_sm_test", None)


def test_models_of_one_process_each_import_their_own_sibling_modules(tmp_path: Path) -> None:
    """A multi-model endpoint's shared worker process: two models whose code has the same
    module names (inference.py, helper.py) each get their own, and keep them."""
    folders = []
    for value in (1, 2):
        code = tmp_path / f"model{value}" / "code"
        code.mkdir(parents=True)
        (code / "helper_for_sm_test.py").write_text(f"VALUE = {value}\n")
        (code / "sm_shared_test.py").write_text(
            "import helper_for_sm_test\n\ndef model_fn(model_dir):\n"
            "    return helper_for_sm_test.VALUE\n"
        )
        folders.append(code)
    try:
        first = import_user_module(folders[0], "sm_shared_test")
        second = import_user_module(folders[1], "sm_shared_test")
        assert first is not None and second is not None and first is not second
        assert (first.model_fn("/m"), second.model_fn("/m")) == (1, 2)
    finally:
        for code in folders:
            sys.path.remove(str(code))
        sys.modules.pop("sm_shared_test", None)
        sys.modules.pop("helper_for_sm_test", None)
