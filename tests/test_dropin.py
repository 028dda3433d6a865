"""Behaviour a user of jax.custom_jvp / custom_vjp expects of a bound op, as JAX's own
tests hold their custom functions to: copies, pickling, rules that save nothing,
checkpointing, and one error type for failing host and compiled code."""
import copy
import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import anybind as ab
from helpers import assert_close


def _two_x_bwd(res, ct):
    return (2 * ct,)


def _sin_vjp(primals, ct):
    return (np.cos(primals[0]) * ct,)


# --------------------------------------------------------------------------- copies

def test_deepcopy_and_copy_give_the_op_itself():
    """Ports CustomJVPTest.test_deepcopy / CustomVJPTest.test_deepcopy: a copy works as the
    original (an op is a function: as for a ``def``, its copies are itself)."""
    op = ab.bind(np.sin, shape=ab.like(0), name="copied", vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    for c in (copy.copy(op), copy.deepcopy(op), copy.deepcopy([op])[0]):
        assert c is op
        assert_close(jax.grad(lambda v: c(v).sum())(jnp.ones(3)), np.cos(np.ones(3)))


def test_an_op_of_module_level_functions_pickles():
    op = ab.bind(np.sin, shape=ab.like(0), name="pickled")
    op.def_vjp(_sin_vjp)
    back = pickle.loads(pickle.dumps(op))
    assert back is not op and back.name == "pickled"
    x = jnp.linspace(0.0, 1.0, 3)
    assert_close(back(x), jnp.sin(x))
    assert_close(jax.grad(lambda v: back(v).sum())(x), jnp.cos(x))


def _unpicklable(f):
    """``f`` closing over a lock: neither pickle nor cloudpickle takes it."""
    lock = threading.Lock()
    return lambda *a: f(*a) if lock else None


def test_an_op_whose_function_does_not_pickle_raises_pickles_error():
    op = ab.bind(_unpicklable(np.sin), shape=ab.like(0), name="lambda_op")
    with pytest.raises(pickle.PicklingError, match="'lambda_op'.*its function <function.*lambda"):
        pickle.dumps(op)


def test_a_rule_that_does_not_pickle_is_named():
    """Trust round 3, F11: the error names the op and the piece that does not pickle."""
    op = ab.bind(np.sin, shape=ab.like(0), name="rule_not_pickled")
    op.def_vjp(_unpicklable(lambda p, ct: (np.cos(p[0]) * ct,)))
    with pytest.raises(pickle.PicklingError, match="'rule_not_pickled'.*its def_vjp rule"):
        pickle.dumps(op)


def test_a_traced_op_of_a_jax_function_pickles():
    """Trust round 3, F11: jax.numpy's functions refuse pickle (they are not the objects
    their module path names); an op on one pickles them by module and name."""
    op = ab.bind(jnp.sin, traced=True, name="traced_sin")
    back = pickle.loads(pickle.dumps(op))
    x = jnp.linspace(0.0, 1.0, 3)
    assert_close(back(x), jnp.sin(x))
    assert_close(jax.grad(lambda v: back(v).sum())(x), jnp.cos(x))


def test_cloudpickle_takes_what_pickle_does_not():
    """With cloudpickle installed, an op of lambdas pickles (by pickle or cloudpickle) and
    loads back with pickle."""
    cloudpickle = pytest.importorskip("cloudpickle")
    op = ab.bind(lambda x: x * 3, shape=ab.like(0), name="lambda_cloud",
                 vjp=lambda p, ct: (3 * ct,))
    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps(op))
        assert_close(jax.grad(lambda v: back(v).sum())(jnp.ones(2)), jnp.full(2, 3.0))


# ----------------------------------------------------------- fwd rules saving nothing

@pytest.mark.parametrize("saved", [None, (), {}], ids=["None", "tuple", "dict"])
def test_a_fwd_rule_may_save_no_residuals(saved):
    """Ports CustomVJPTest.test_fwd_rule_can_return_none (host fwd/bwd, residuals None)."""
    op = ab.bind(lambda x: 2 * x, shape=ab.like(0), name=f"nores_{type(saved).__name__}")
    op.def_fwd(lambda x: (2 * x, saved), residuals=saved)
    op.def_bwd(_two_x_bwd)
    x = jnp.linspace(0.0, 1.0, 3)
    assert_close(jax.grad(lambda v: op(v).sum())(x), 2 * jnp.ones(3))
    assert_close(jax.jit(jax.grad(lambda v: op(v).sum()))(x), 2 * jnp.ones(3))
    assert_close(jax.vjp(op, x)[1](x)[0], 2 * x)


@pytest.mark.parametrize("wrap", ["eager", "jit"])
def test_grad_of_checkpoint_of_a_host_fwd_bwd_pair(wrap):
    """Ports CustomVJPTest.test_remat (host fwd/bwd): the bwd rule runs on residuals the
    fwd rule makes again in the backward pass."""
    op = ab.bind(np.sin, shape=ab.like(0), name=f"ckpt_{wrap}")
    op.def_fwd(lambda x: (np.sin(x), np.cos(x)), residuals=ab.like(0))
    op.def_bwd(lambda r, ct: (r * ct,))
    g = jax.grad(lambda v: jax.checkpoint(op)(v).sum())
    g = jax.jit(g) if wrap == "jit" else g
    x = jnp.linspace(0.0, 1.0, 3)
    assert_close(g(x), jnp.cos(x))
    # forward mode still has no rule to run, and says so
    with pytest.raises(ab.MissingRuleError, match=f"'ckpt_{wrap}' has no jvp rule"):
        jax.jvp(op, (x,), (x,))


# -------------------------------------------------- one error type on every route

@pytest.mark.parametrize("how", ["grad", "jvp", "vmap"])
def test_failing_compiled_code_raises_host_error_under_unjitted_transformations(how):
    """Compiled code fails as host code does: ``ab.HostError`` wherever the call is eager."""
    import compiled_ops as co
    op = ab.bind(co.clib("ctypes")["checked_sqrt"], shape=ab.like(0), name=f"csqrt_{how}",
                 jvp=lambda p, t: t[0] / (2 * np.sqrt(np.abs(p[0]))),
                 vjp=lambda p, ct: (ct / (2 * np.sqrt(np.abs(p[0]))),))
    x = np.array([4.0, -1.0, 9.0])
    run = {"grad": lambda: jax.grad(lambda v: op(v).sum())(x),
           "jvp": lambda: jax.jvp(op, (x,), (x,)),
           "vmap": lambda: jax.vmap(op)(x[:, None])}[how]
    with pytest.raises(ab.HostError, match=rf"anybind op 'csqrt_{how}': the compiled "
                                           r"function returned status 7"):
        run()


def test_host_errors_of_jvp_rules_are_host_errors_too():
    def bad_jvp(p, t):
        raise ValueError("no tangent today")
    op = ab.bind(np.sin, shape=ab.like(0), name="bad_jvp", jvp=bad_jvp)
    with pytest.raises(ab.HostError, match=r"'bad_jvp': the jvp rule raised ValueError"):
        jax.jvp(op, (np.ones(2),), (np.ones(2),))
