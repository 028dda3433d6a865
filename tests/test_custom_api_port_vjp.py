"""JAX's tests of ``jax.custom_vjp`` (``tests/custom_api_test.py`` in jax-ml/jax,
class CustomVJPTest, and the ``custom_gradient`` cases in it), rewritten for
anybind ops with the same rules, keeping their assertions.

How a case translates: ``defvjp(fwd, bwd)`` becomes a traced ``vjp=`` rule
that recomputes from the primals what ``fwd`` saved (or, where the residuals
matter, a host ``def_fwd``/``def_bwd`` pair); ``nondiff_argnums`` become
static keywords or keyword operands; ``symbolic_zeros=True`` gives zero
cotangents as ``None`` and, in place of ``CustomVJPPrimal.perturbed``, a
``needs`` flag per argument. Where JAX raises and anybind deliberately does
more (forward mode of an op with only a vjp rule, tracers as non-differentiable
arguments, keywords), the test asserts anybind's numbers and says so. Python
control flow on values runs in host code, so those cases bind host functions.

Left out, with the reason:

- test_vmap_axes, test_pmap: empty in JAX (``SkipTest("TODO")``).
- test_optimize_remat, test_optimize_remat_vmap, test_optimize_remat_cond,
  test_optimize_remat_jvp: unit tests of JAX's private
  ``custom_derivatives.optimize_remat_of_custom_vjp_fwd``.
- test_bwd_rule_shape_mismatch_disable: JAX's ``disable_bwd_checks`` flag;
  anybind always checks a rule's results.
- test_closure_convert_pytree_mismatch: the argument checking of
  ``jax.closure_convert``'s result alone, no custom rule involved.
- test_custom_lin_pretty_print: prints JAX's internal ``custom_lin`` primitive.
- test_custom_gradient_with_logs, test_custom_gradient_with_logs_bad_return_errors,
  test_defvjp_with_logs, test_defvjp_with_logs_nondiff_argnums_and_none_logs,
  test_defvjp_with_logs_bad_return_errors: logs returned by a bwd rule
  (``with_logs``), an API newer than the JAX release tested here, with no
  anybind counterpart.

Also ported: the cases JAX's subclass CustomVJP3Test adds (at the end of the
file), except test_hityped_tracers (JAX's hijax types),
test_expand_stages_call_without_inlining (JAX's lowering) and its own
pretty-printing tests.

``xfail(strict=True)`` marks ports that fail because of a known anybind
defect (issue 19); each names the item.
"""
import copy

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from jax import lax, tree_util

import anybind as ab
from helpers import assert_close, custom_vjp, scan1

pytestmark = pytest.mark.slow  # a ported suite: JAX's own custom_jvp/custom_vjp tests


def _sin_vjp():
    return custom_vjp(jnp.sin, lambda p, g: (2 * jnp.cos(p[0]) * g,), name="sin2")


# ports CustomVJPTest.test_basic
def test_basic():
    f, x = _sin_vjp(), 3.
    assert_close(f(x), jnp.sin(x))
    assert_close(jax.grad(f)(x), 2 * jnp.cos(x))
    assert_close(jax.value_and_grad(f)(x), (jnp.sin(x), 2 * jnp.cos(x)))


# ports CustomVJPTest.test_invariance
def test_invariance():
    f = custom_vjp(lambda x: jnp.cos(2 * x) / 2., lambda p, g: (g * 3,))
    f2 = lambda x: jax.value_and_grad(f)(x)[0]
    f3 = lambda x: jax.value_and_grad(f2)(x)[0]
    x = 1.
    assert_close(f(x), f2(x))
    assert_close(f(x), f3(x))
    assert_close(jax.grad(f)(x), jax.grad(f2)(x))
    assert_close(jax.grad(f)(x), jax.grad(f3)(x))


# ports CustomVJPTest.test_deepcopy
def test_deepcopy():
    f = custom_vjp(jnp.sin, lambda p, g: (jnp.cos(p[0]) * g,))
    g = copy.deepcopy(f)
    assert_close(jax.grad(g)(1.), jnp.cos(1.))


# ports CustomVJPTest.test_python_control_flow
def test_python_control_flow():
    # Python control flow on values: host code, with JAX's fwd/bwd as host rules
    fn = lambda x: np.sin(x) if x > 0 else np.cos(x)
    f = ab.bind(fn, shape=ab.like(0), name="f")
    f.def_fwd(lambda x: (fn(x), x), residuals=lambda x: x)
    f.def_bwd(lambda x, g: (2 * g if x > 0 else 3 * g,))
    x = 2.
    assert_close(f(x), jnp.sin(x))
    assert_close(f(-x), jnp.cos(-x))
    assert_close(jax.value_and_grad(f)(x), (jnp.sin(x), 2.))
    assert_close(jax.value_and_grad(f)(-x), (jnp.cos(-x), 3.))


# ports CustomVJPTest.test_python_control_flow_bwd
def test_python_control_flow_bwd():
    # a traced function (lax.cond, no Python control flow) with host fwd/bwd rules
    # that branch in Python
    f = ab.bind(lambda x: lax.cond(x > 0, jnp.sin, jnp.cos, x), traced=True, name="f")
    f.def_fwd(lambda x: (np.sin(x) if x > 0 else np.cos(x), x), residuals=lambda x: x)
    f.def_bwd(lambda x, g: (2 * g if x > 0 else 3 * g,))
    x = 2.
    assert_close(f(x), jnp.sin(x))
    assert_close(f(-x), jnp.cos(-x))
    assert_close(jax.value_and_grad(f)(x), (jnp.sin(x), 2.))
    assert_close(jax.value_and_grad(f)(-x), (jnp.cos(-x), 3.))


# ports CustomVJPTest.test_vmap
def test_vmap():
    def fn(x):
        assert jnp.ndim(x) == 0
        return jnp.sin(x)
    f = custom_vjp(fn, lambda p, g: (2 * jnp.cos(p[0]) * g,))
    x, xx = jnp.arange(3.), jnp.arange(6.).reshape(2, 3)
    assert_close(jax.vmap(f)(x), jnp.sin(x))
    assert_close(jax.vmap(jax.vmap(f))(xx), jnp.sin(xx))
    assert_close(jax.vmap(jax.grad(f))(x), 2 * jnp.cos(x))
    assert_close(jax.vmap(jax.value_and_grad(f))(x), (jnp.sin(x), 2 * jnp.cos(x)))
    assert_close(jax.vmap(jax.vmap(jax.grad(f)))(xx), 2 * jnp.cos(xx))
    assert_close(jax.vmap(jax.vmap(jax.value_and_grad(f)))(xx), (jnp.sin(xx), 2 * jnp.cos(xx)))
    assert_close(jax.grad(lambda x: jax.vmap(f)(x).sum())(x), 2 * jnp.cos(x))
    assert_close(jax.grad(lambda x: jax.vmap(jax.vmap(f))(x).sum())(xx), 2 * jnp.cos(xx))
    assert_close(jax.vmap(jax.grad(lambda x: jax.vmap(f)(x).sum()))(xx), 2 * jnp.cos(xx))


# ports CustomVJPTest.test_jit
def test_jit():
    f, x = _sin_vjp(), 3.
    assert_close(jax.jit(f)(x), jnp.sin(x))
    assert_close(jax.jit(jax.jit(f))(x), jnp.sin(x))
    assert_close(jax.jit(jax.grad(f))(x), 2 * jnp.cos(x))
    assert_close(jax.grad(jax.jit(f))(x), 2 * jnp.cos(x))


# ports CustomVJPTest.test_pytrees
def test_pytrees():
    f = custom_vjp(lambda x: {"b": jnp.sin(x["a"])},
                   lambda p, g: ({"a": 2 * jnp.cos(p[0]["a"]) * g["b"]},))
    x = {"a": 3.}
    assert_close(f(x)["b"], jnp.sin(x["a"]))
    assert_close(jax.grad(lambda x: f(x)["b"])(x), {"a": 2 * jnp.cos(x["a"])})


# ports CustomVJPTest.test_jvp_error
def test_jvp_error():
    # JAX: "can't apply forward-mode autodiff (jvp) to a custom_vjp function";
    # anybind transposes the traced vjp rule into the jvp
    f = _sin_vjp()
    assert_close(jax.jvp(f, (3.,), (1.,)), (jnp.sin(3.), 2 * jnp.cos(3.)))
    x = jnp.arange(3.)
    assert_close(jax.jvp(jax.vmap(f), (x,), (jnp.ones(3),)), (jnp.sin(x), 2 * jnp.cos(x)))
    assert_close(jax.jvp(jax.jit(f), (3.,), (1.,)), (jnp.sin(3.), 2 * jnp.cos(3.)))


# ports CustomVJPTest.test_kwargs
def test_kwargs():
    # c=2. is a static keyword, reaching the rule too
    my_fun = custom_vjp(lambda x, y, c=1.: c * (x + y), lambda p, g, c=1.: (c * g, c * g))
    f = lambda x, y: jnp.square(my_fun(x, y, c=2.)).sum()
    ref = lambda x, y: jnp.square(2. * (x + y)).sum()
    assert_close(f(10., 5.), ref(10., 5.))
    assert_close(jax.grad(f)(10., 5.), jax.grad(ref)(10., 5.))


# ports CustomVJPTest.test_initial_style
def test_initial_style():
    foo = scan1(_sin_vjp())
    assert_close(jax.grad(foo)(3.), 2. * jnp.cos(3.))
    assert_close(jax.grad(jax.grad(foo))(3.), -2. * jnp.sin(3.))


# ports CustomVJPTest.test_initial_style_vmap
def test_initial_style_vmap():
    def fn(x):
        assert jnp.ndim(x) == 0
        return 3 * x
    foo = scan1(custom_vjp(fn, lambda p, g: (2 * jnp.cos(p[0]) * g,)))
    x = jnp.arange(3.)
    assert_close(jax.vmap(foo)(x), 3. * x)
    assert_close(jax.grad(lambda x: jax.vmap(foo)(x).sum())(x), 2. * jnp.cos(x))


# ports CustomVJPTest.test_nondiff_argnums
def test_nondiff_argnums():
    app = custom_vjp(lambda x, *, f: f(x), lambda p, g, *, f: (jnp.cos(p[0]) * g,))
    assert_close(app(1, f=lambda x: 2 * x), 2)
    assert_close(jax.value_and_grad(lambda x: app(x, f=lambda y: 2 * y))(1.), (2., jnp.cos(1.)))


# ports CustomVJPTest.test_nondiff_argnames
def test_nondiff_argnames():
    # nondiff_argnames=('f',): a static keyword, passed by name as in JAX
    app = custom_vjp(lambda x, *, f: f(x), lambda p, g, *, f: (jnp.cos(p[0]) * g,))
    assert_close(app(1, f=lambda x: 2 * x), 2)
    assert_close(jax.value_and_grad(lambda x: app(x, f=lambda y: 2 * y))(1.), (2., jnp.cos(1.)))


# ports CustomVJPTest.test_nondiff_argnums_unhashable
def test_nondiff_argnums_unhashable():
    # a static keyword must be hashable: the list is refused with the remedy, and
    # the tuple (or an array, a keyword operand) works under grad, jit and vmap
    f = custom_vjp(lambda x, *, lst: lst[0] * jnp.sin(x),
                   lambda p, g, *, lst: (lst[0] * jnp.cos(p[0]) * g,))
    with pytest.raises(TypeError, match="'f': keyword argument 'lst' is neither an array.*"
                                        "nor hashable.*a tuple instead of a list"):
        f(3., lst=[2.])
    for lst in [(2.,), jnp.array([2.])]:
        assert_close(f(3., lst=lst), 2. * jnp.sin(3.))
        assert_close(jax.grad(lambda x: f(x, lst=lst))(3.), 2. * jnp.cos(3.))
        assert_close(jax.jit(lambda x: jax.grad(lambda x: f(x, lst=lst))(x))(3.),
                     2. * jnp.cos(3.))
        assert_close(jax.vmap(jax.grad(lambda x: f(x, lst=lst)))(jnp.arange(3.)),
                     2. * jnp.cos(jnp.arange(3.)))


# ports CustomVJPTest.test_nondiff_argnums_argnames
def test_nondiff_argnums_argnames():
    app = custom_vjp(lambda x, *, f, g: f(x) + g(x), lambda p, v, *, f, g: (jnp.cos(p[0]) * v,))
    f = lambda x: 2 * x
    g = lambda x: 2 * x
    assert_close(app(1, f=f, g=g), 4)
    assert_close(jax.value_and_grad(lambda x: app(x, f=f, g=g))(1.), (4., jnp.cos(1.)))


# ports CustomVJPTest.test_closed_over_jit_tracer
def test_closed_over_jit_tracer():
    # skipped in JAX ("behavior no longer supported"); works here
    def outer(x):
        return custom_vjp(lambda y: x * y, lambda p, g: (jnp.cos(p[0]) * g,))
    g = jax.jit(lambda x, y: outer(x)(y))
    assert_close(g(2., 3.), 6.)
    assert_close(jax.grad(g, 1)(2., 3.), jnp.cos(3.))


# ports CustomVJPTest.test_closed_over_vmap_tracer
def test_closed_over_vmap_tracer():
    def outer(x):
        return custom_vjp(lambda y: x * y, lambda p, g: (jnp.cos(p[0]) * g,))
    g = jax.vmap(lambda x: outer(x)(3.))
    assert_close(g(np.arange(3.)), np.arange(3.) * 3)


# ports CustomVJPTest.test_closed_over_tracer3
def test_closed_over_tracer3():
    def outer(x):  # JAX's fwd saved x; the vjp rule closes over it
        f = custom_vjp(lambda y: x * y, lambda p, g: (jnp.cos(p[0]) * g * x,))
        return jax.grad(f)
    g = jax.vmap(lambda x: outer(x)(3.))
    assert_close(g(np.arange(3.)), np.cos(3.) * np.arange(3.))


# ports CustomVJPTest.test_nondiff_arg_tracer_error
def test_nondiff_arg_tracer_error():
    # JAX raises UnexpectedTracerError for a jit tracer in nondiff_argnums; a keyword
    # operand carries it here
    f = custom_vjp(lambda y, *, x: x * y, lambda p, g, *, x: (jnp.cos(p[0]) * g,))
    g = jax.jit(lambda x, y: f(y, x=x))
    assert_close(g(2., 3.), 6.)
    assert_close(jax.grad(g, 1)(2., 3.), jnp.cos(3.))


# ports CustomVJPTest.test_nondiff_arg_nested_tracer_error
def test_nondiff_arg_nested_tracer_error():
    # as above, the tracer inside a container: a pytree keyword operand
    f = custom_vjp(lambda y, *, xs: xs[0] * y, lambda p, g, *, xs: (jnp.cos(p[0]) * g,))
    g = jax.jit(lambda x, y: f(y, xs=(x,)))
    assert_close(g(2., 3.), 6.)
    assert_close(jax.grad(g, 1)(2., 3.), jnp.cos(3.))


# ports CustomVJPTest.test_missing_vjp_rule_error
def test_missing_vjp_rule_error():
    # JAX raises already when calling foo; a traced op without rules would use JAX's
    # own derivative, so the analogue is a host op: calling it works, grad raises
    foo = ab.bind(lambda x: x ** 2, shape=ab.like(0), name="foo")
    assert_close(foo(2.), 4.)
    with pytest.raises(ab.MissingRuleError, match="'foo'.*def_vjp"):
        jax.grad(foo)(2.)


# ports CustomVJPTest.test_vjp_rule_inconsistent_pytree_structures_error
def test_vjp_rule_inconsistent_pytree_structures_error():
    f = custom_vjp(lambda x: x, lambda p, g: (g, g))
    assert_close(f(2.), 2.)
    with pytest.raises(TypeError, match=r"'f': the vjp rule must return a tuple with one "
                                        r"cotangent per positional argument \(1\), got 2"):
        jax.grad(f)(2.)


# ports CustomVJPTest.test_vjp_bwd_returns_non_tuple_error
def test_vjp_bwd_returns_non_tuple_error():
    f = custom_vjp(lambda x: x, lambda p, g: 2. * g)
    with pytest.raises(TypeError, match=r"'f': the vjp rule must return a tuple"):
        jax.grad(f)(3.)


# ports CustomVJPTest.test_fwd_rule_primal_out_type_doesnt_match_primal_error_message
def test_fwd_rule_primal_out_type_doesnt_match_primal_error_message():
    # a host fwd rule whose output is not the function's: checked against the
    # declared output when it runs (inside the compiled scan: a JaxRuntimeError
    # carrying the HostError's message), naming the op, the rule and both types
    def scan_apply(f, x):
        return lax.scan(lambda x, _: (f(x), None), x, None, length=1)[0]
    for fwd, got in [(lambda x: ((x, x), x), r"\(2,\)"),  # the pair becomes an array
                     (lambda x: (np.zeros((3, *x.shape), x.dtype), x), r"\(3,\)")]:
        f = ab.bind(lambda x: x, shape=ab.like(0), name="f")
        f.def_fwd(fwd, residuals=lambda x: x)
        f.def_bwd(lambda r, y_bar: (y_bar,))
        with pytest.raises((ab.HostError, jax.errors.JaxRuntimeError),
                           match=rf"'f': the fwd rule's output 0 has shape {got} and dtype "
                                 rf"float32; declared shape \(\) and dtype float32"):
            jax.grad(lambda x: scan_apply(f, x))(jnp.float32(1.))


# ports CustomVJPTest.test_issue2511
def test_issue2511():
    # JAX's case is its own det under vmap; here det is bound, with the vjp
    # ȳ·det(A)·A⁻ᵀ
    det = custom_vjp(jnp.linalg.det,
                     lambda p, g: (g[..., None, None] * jnp.linalg.det(p[0])[..., None, None]
                                   * jnp.linalg.inv(p[0]).T,), name="det")
    arr = jnp.asarray(np.random.default_rng(0).normal(size=(5, 2, 2)))
    foo = lambda x: jax.vmap(det, (0,))(x)
    assert_close(jax.jit(foo)(arr), jnp.linalg.det(arr))
    assert_close(jax.grad(lambda a: foo(a).sum())(arr),
                 jax.grad(lambda a: jnp.linalg.det(a).sum())(arr))


# ports CustomVJPTest.test_lowering_out_of_traces
def test_lowering_out_of_traces():
    relu = custom_vjp(lambda x: jnp.maximum(x, 0.),
                      lambda p, g: (jnp.where(p[0] > 0, g, 0.),), name="relu")

    class F(tuple):  # JAX's namedtuple: a pytree whose leaf feeds the op
        def __call__(self, x):
            return relu(self[0]) * x
    tree_util.register_pytree_node(F, lambda f: (tuple(f), None), lambda _, c: F(c))
    g = jax.jit(lambda f, x: f(x))
    assert_close(jax.grad(g, argnums=(1,))(F((2.0,)), 0.), (2.0,))
    assert_close(jax.grad(g)(F((2.0,)), 3.), F((3.0,)))


# ports CustomVJPTest.test_clip_gradient
def test_clip_gradient():
    clip = custom_vjp(lambda lo, hi, x: x, lambda p, g: (None, None, jnp.clip(g, p[0], p[1])),
                      name="clip")
    assert_close(jax.grad(lambda x: clip(-0.1, x + 0.1, x))(0.1), 0.2)


# ports CustomVJPTest.test_nestable_vjp
def test_nestable_vjp():
    f = lambda x: x ** 2
    g = custom_vjp(f, lambda p, ct: jax.vjp(f, *p)[1](ct), name="g")
    _, g_vjp = jax.vjp(g, 1.0)
    assert_close(g_vjp(1.0)[0], 2.0)
    z = jax.jit(lambda x: jax.vjp(g, x)[1])
    assert_close(z(1.0)(3.0)[0], 6.0)


# ports CustomVJPTest.test_initial_style_vmap_2
def test_initial_style_vmap_2():
    x = jnp.ones((4, 3))  # JAX: (10, 3)
    custom_fun = custom_vjp(lambda x: x.sum(), lambda p, g: (g * jnp.ones_like(p[0]),),
                            name="custom_fun")

    def train_fun(x):
        return jax.grad(lambda x: jax.vmap(custom_fun)(x).sum())(x)
    _, ys = lax.scan(lambda carry, _: (carry, train_fun(carry)), x, jnp.arange(4))
    assert_close(ys, jnp.ones((4, 4, 3)))


# ports CustomVJPTest.test_initial_style_vmap_3
def test_initial_style_vmap_3():
    y = jnp.arange(1., 4.)  # a constant the function closes over

    def fn(x):
        assert jnp.ndim(x) == 0
        return 3 * x * jnp.sum(y)
    foo = scan1(custom_vjp(fn, lambda p, g: (2 * jnp.cos(p[0]) * g,)))
    x = jnp.arange(3.)
    assert_close(jax.vmap(foo)(x), 3. * x * 6)
    assert_close(jax.grad(lambda x: jax.vmap(foo)(x).sum())(x), 2. * jnp.cos(x))


# ports CustomVJPTest.test_initial_style_vmap_with_collective
def test_initial_style_vmap_with_collective():
    f = custom_vjp(lambda x: lax.psum(x, "foo"), lambda p, dx: (dx,))

    def g(x):  # JAX evaluates f's jaxpr; the op is the same primitive either way
        return jax.extend.core.jaxpr_as_fun(jax.make_jaxpr(f)(x))(x)[0]
    out = jax.vmap(lambda _, x: g(x), axis_name="foo", in_axes=(0, None),
                   out_axes=None)(jnp.arange(4.), 2.)
    assert_close(out, 8.)


# ports CustomVJPTest.test_bwd_closes_over_tracer
@pytest.mark.parametrize("transform", ["jit", "vmap", "jit_vmap", "vmap_jit", "grad"])
def test_bwd_closes_over_tracer(transform):
    def f(y):
        g = custom_vjp(lambda x: 2. * jnp.sin(x), lambda p, ct: (2. * jnp.cos(y) * ct,),
                       name="g")
        return jax.grad(g)(1.)
    x = jnp.arange(3.)
    run, arg, expected = {
        "jit": (jax.jit(f), 2., 2. * jnp.cos(2.)),
        "vmap": (jax.vmap(f), x, 2. * jnp.cos(x)),
        "jit_vmap": (jax.jit(jax.vmap(f)), x, 2. * jnp.cos(x)),
        "vmap_jit": (jax.vmap(jax.jit(f)), x, 2. * jnp.cos(x)),
        "grad": (jax.grad(f), 4., -2. * jnp.sin(4.)),  # through the closed-over y
    }[transform]
    assert_close(run(arg), expected)


# ports CustomVJPTest.test_fwd_closes_over_tracer
@pytest.mark.parametrize("transform", ["jit", "vmap", "jit_vmap", "vmap_jit", "grad"])
def test_fwd_closes_over_tracer(transform):
    # JAX's fwd saves the closed-over y as its residual; here the rule closes over
    # a value computed from y in the enclosing trace
    def f(y):
        res = jnp.cos(y)
        g = custom_vjp(lambda x: 2. * jnp.sin(x), lambda p, ct: (2. * res * ct,), name="g")
        return jax.grad(g)(1.)
    x = jnp.arange(3.)
    run, arg, expected = {
        "jit": (jax.jit(f), 2., 2. * jnp.cos(2.)),
        "vmap": (jax.vmap(f), x, 2. * jnp.cos(x)),
        "jit_vmap": (jax.jit(jax.vmap(f)), x, 2. * jnp.cos(x)),
        "vmap_jit": (jax.vmap(jax.jit(f)), x, 2. * jnp.cos(x)),
        "grad": (jax.grad(f), 4., -2. * jnp.sin(4.)),
    }[transform]
    assert_close(run(arg), expected)


# ports CustomVJPTest.test_float0
def test_float0():
    # the rule's cotangent 1 for the integer argument is dropped: grad gives float0
    f = custom_vjp(lambda x, _: x, lambda p, g: (2., 1))
    gx, gy = jax.grad(f, allow_int=True, argnums=(0, 1))(2., 3)
    assert_close(gx, 2.)
    assert gy.dtype == jax.dtypes.float0 and gy.shape == ()


# ports CustomVJPTest.test_float0_initial_style
def test_float0_initial_style():
    f = custom_vjp(lambda x: x, lambda p, g: ((2., jnp.zeros((), dtype=jax.dtypes.float0)),))
    foo = lambda x, y: lax.scan(lambda c, _: (f(c), None), (x, y), None, length=1)[0][0]
    gx, gy = jax.grad(foo, allow_int=True, argnums=(0, 1))(2., 3)
    assert_close(gx, 2.)
    assert gy.dtype == jax.dtypes.float0 and gy.shape == ()


# ports CustomVJPTest.test_remat
def test_remat():
    f = _sin_vjp()
    g = jax.remat(lambda x: f(f(x)))
    assert_close(g(2.), np.sin(np.sin(2.)))
    assert_close(jax.grad(g)(2.), 4. * jax.grad(lambda x: jnp.sin(jnp.sin(x)))(2.))


# ports CustomVJPTest.test_remat_pytree_arg
def test_remat_pytree_arg():
    f = custom_vjp(lambda xy: xy["a"] * xy["b"],
                   lambda p, g: ({"a": g * p[0]["b"], "b": g * p[0]["a"]},))
    g = jax.remat(lambda xy: jnp.sin(f(xy)))
    xy = {"a": 2., "b": 3.}
    assert_close(g(xy), np.sin(6.))
    assert_close(jax.grad(g)(xy), {"a": np.cos(6.) * 3., "b": np.cos(6.) * 2.})


# ports CustomVJPTest.test_remat_nondiff_argnums
def test_remat_nondiff_argnums():
    f = custom_vjp(lambda x, *, k: jnp.sin(k * x), lambda p, g, *, k: (k * jnp.cos(k * p[0]) * g,))
    g = jax.remat(lambda x: f(x, k=2.) * 3.)
    assert_close(g(0.5), 3. * np.sin(2. * 0.5))
    assert_close(jax.grad(g)(0.5), 3. * 2. * np.cos(2. * 0.5))


# ports CustomVJPTest.test_symbolic_zeros_nondiff_argnums
def test_symbolic_zeros_nondiff_argnums():
    # the static keyword k arrives as the Python float it is; in place of the
    # perturbed flag, `needs` says which cotangents are wanted
    f = ab.bind(lambda x, *, k: k * x, traced=True, name="f")

    @f.def_vjp(traced=True, symbolic_zeros=True)
    def _(p, g, *, k, needs):
        assert isinstance(k, float)
        assert needs == (True,)
        return (k * g,)
    assert_close(jax.grad(lambda x: f(x, k=2.))(3.), 2.)


# ports CustomVJPTest.test_remat_higher_order
def test_remat_higher_order():
    f = _sin_vjp()
    g = lambda x: f(f(x))
    G = jax.grad
    # one compiled program (eagerly, every primitive of a third derivative would be
    # dispatched on its own)
    got, want = jax.jit(lambda x: ([G(G(jax.remat(g)))(x), G(jax.remat(G(g)))(x),
                                    G(G(G(jax.remat(g))))(x)],
                                   [G(G(g))(x), G(G(g))(x), G(G(G(g)))(x)]))(2.)
    assert_close(got, want)


def _bwd_nones_op():
    return custom_vjp(lambda x, y: x * jnp.sin(y), lambda p, g: (None, 2 * jnp.cos(p[1]) * g))


# ports CustomVJPTest.test_bwd_nones
def test_bwd_nones():
    assert_close(jax.grad(lambda x: _bwd_nones_op()(x, x))(3.), 2 * jnp.cos(3.))


# ports CustomVJPTest.test_bwd_nones_vmap
def test_bwd_nones_vmap():
    f = _bwd_nones_op()
    assert_close(jax.grad(lambda x: jax.vmap(f)(x, x).sum())(jnp.arange(3.)),
                 2 * jnp.cos(jnp.arange(3.)))


# ports CustomVJPTest.test_bwd_nones_pytree
def test_bwd_nones_pytree():
    f = custom_vjp(lambda xs, y: xs[0] * xs[1] * jnp.sin(y),
                   lambda p, g: (None, 2 * jnp.cos(p[1]) * g))
    assert_close(jax.grad(lambda x: f((x, x), x))(3.), 2 * jnp.cos(3.))


# ports CustomVJPTest.test_custom_vjp_closure_4521
def test_custom_vjp_closure_4521():
    # an op with no outputs (None) under vmap with out_axes=None, in a vjp in a scan;
    # its rule never runs
    def rule(p, z_bar):
        raise AssertionError("should not run")
    g = custom_vjp(lambda x, y: None, rule, name="g")

    def f(xs, y):
        jax.vmap(g, in_axes=(0, None), out_axes=None)(xs, y)

    def scan_body(xs, _):
        _, vjp_f = jax.vjp(f, xs, jnp.zeros(1))
        return xs, vjp_f(None)
    xs, cts = lax.scan(scan_body, jnp.ones(5), None, 3)  # JAX: 100 steps
    assert_close(xs, jnp.ones(5))
    assert_close(cts, (jnp.zeros((3, 5)), jnp.zeros((3, 1))))


# ports CustomVJPTest.test_float0_bwd_none
def test_float0_bwd_none():
    f = custom_vjp(lambda i, x: jnp.sin(x), lambda p, g: (None, 2 * jnp.cos(p[1]) * g))
    assert_close(jax.grad(f, 1)(jnp.array([1, 2]), 3.), 2 * jnp.cos(3.))


# ports CustomVJPTest.test_custom_gradient
def test_custom_gradient():
    # jax.custom_gradient's vjp closure is a traced vjp rule of the primals
    f = custom_vjp(lambda x: x ** 2, lambda p, g: (g * p[0],))
    assert_close(f(3.), 9.)
    assert_close(jax.grad(f)(3.), 3.)
    assert_close(jax.grad(jax.grad(f))(3.), 1.)


# ports CustomVJPTest.test_custom_gradient_2
def test_custom_gradient_2():
    f = custom_vjp(lambda x, y: x * y, lambda p, g: (p[1], p[0]))
    assert_close(f(3., 4.), 12.)
    assert_close(jax.grad(f, argnums=(0, 1))(3., 4.), (4., 3.))


# ports CustomVJPTest.test_custom_gradient_3
def test_custom_gradient_3():
    f = custom_vjp(lambda x: jnp.sum(jnp.sin(x)),
                   lambda p, g: (jnp.cos(p[0]) * jnp.arange(3., 6.),))
    assert_close(f(jnp.arange(3.)), jnp.sum(jnp.sin(jnp.arange(3.))))
    assert_close(jax.grad(f)(jnp.arange(3.)),
                 jax.grad(lambda x: jnp.sum(jnp.sin(x)))(jnp.arange(3.)) * jnp.arange(3., 6.))


# ports CustomVJPTest.test_custom_gradient_can_return_singleton_value_in_vjp
def test_custom_gradient_can_return_singleton_value_in_vjp():
    # custom_gradient accepts a bare cotangent; anybind's vjp rules, like
    # custom_vjp's bwd, return a tuple: the bare value is an error naming the op
    f = custom_vjp(lambda x: x ** 2, lambda p, g: g * p[0])
    assert_close(f(3.), 9.)
    with pytest.raises(TypeError, match="'f': the vjp rule must return a tuple"):
        jax.grad(f)(3.)
    f = custom_vjp(lambda x: x ** 2, lambda p, g: (g * p[0],))
    assert_close(jax.grad(f)(3.), 3.)
    assert_close(jax.grad(jax.grad(f))(3.), 1.)


def _cos_after(fn, x):
    # jax.closure_convert makes the closed-over values positional arguments, whose
    # cotangents the rule then gives
    converted_fn, aux_args = jax.closure_convert(fn, x)
    assert len(aux_args) <= 1
    op = custom_vjp(lambda x, *args, fn: jnp.cos(fn(x, *args)),
                    lambda p, g, *, fn: (17. * p[0], *[42. * a for a in p[1:]]), name="cos_after")
    return op(x, *aux_args, fn=converted_fn)


# ports CustomVJPTest.test_closure_convert
def test_closure_convert():
    def dist(c, x):
        return jnp.sum((x - c) ** 2.)

    def solve(c, x):
        return _cos_after(lambda x: dist(c, x), x)
    c, x = 2. * jnp.ones(2), jnp.ones(2)
    assert_close(solve(c, x), jnp.cos(dist(c, x)))
    g_c, g_x = jax.grad(solve, argnums=(0, 1))(c, x)
    assert_close(g_c, 42. * c)
    assert_close(g_x, 17. * x)


# ports CustomVJPTest.test_closure_convert_mixed_consts
def test_closure_convert_mixed_consts():
    def dist(c, s, x):
        return jnp.sum(s * (x - c) ** 2.)

    def solve(c, s, x):
        return _cos_after(lambda x: dist(c, s, x), x)
    c, s, x = 2. * jnp.ones(2), 3. * jnp.ones(2), jnp.ones(2)
    assert_close(solve(c, s, x), jnp.cos(dist(c, s, x)))
    g_c, g_x = jax.grad(solve, argnums=(0, 2))(c, s, x)
    assert_close(g_c, 42. * c)
    assert_close(g_x, 17. * x)


# ports CustomVJPTest.test_float0_cotangents_automatically_handled
def test_float0_cotangents_automatically_handled():
    f = custom_vjp(lambda x, y: x, lambda p, zbar: (0., 1))
    gx, gy = jax.jit(lambda y: jax.vjp(f, 0., y)[1](1.))(1)
    assert_close(gx, 0.)
    assert gy.dtype == jax.dtypes.float0


# ports CustomVJPTest.test_custom_vjp_scan_batching_edge_case
def test_custom_vjp_scan_batching_edge_case():
    mul = custom_vjp(lambda x, coeff: x * coeff,
                     lambda p, g: (g * p[1], (p[0] * g).sum()), name="mul")

    def scan_over_mul(x, coeff):
        return lax.scan(lambda x, t: (mul(x, coeff), None), x, jnp.arange(3))[0]

    rng = np.random.default_rng(0)
    x_batch, covector = rng.normal(size=(3, 2)), rng.normal(size=(3, 2))
    coeff = jnp.array(1.5)
    batched = jax.vmap(scan_over_mul, in_axes=(0, None), out_axes=0)
    reference = jax.vmap(lambda x, c: x * c ** 3, in_axes=(0, None))
    got = jax.vjp(batched, x_batch, coeff)[1](covector)
    assert_close(got, jax.vjp(reference, x_batch, coeff)[1](covector))
    jax.test_util.check_grads(jax.jit(batched), (x_batch, coeff), order=2, modes=["rev"])


# ports CustomVJPTest.test_closure_with_vmap2
def test_closure_with_vmap2():
    def make(wrap):
        def h(z):
            def f(x):
                return wrap(x)(z)
            return jax.vmap(f)(jnp.arange(3.)).sum()
        return h
    h = make(lambda x: custom_vjp(lambda y: x * y, lambda p, w_bar: (x * w_bar,), name="g"))
    ref = make(lambda x: (lambda y: x * y))
    assert_close(jax.grad(h)(3.14), jax.grad(ref)(3.14))
    jax.test_util.check_grads(jax.jit(h), (3.14,), order=1, modes=["rev"])


# ports CustomVJPTest.test_pytrees_not_required_to_contain_nones
def test_pytrees_not_required_to_contain_nones():
    class A(list):
        pass

    def unflatten(_, children):
        assert children[0] is not None
        return A(children)
    tree_util.register_pytree_node(A, lambda x: (x, None), unflatten)
    f = custom_vjp(lambda x: x[0], lambda p, g: (A([g]),))
    assert_close(jax.grad(f)(A([1.])), A([1.]))


# ports CustomVJPTest.test_vmap_vjp_called_twice
def test_vmap_vjp_called_twice():
    f = custom_vjp(lambda x: x, lambda p, y_bar: (y_bar,))
    _, f_vjp = jax.vjp(jax.vmap(f), jnp.array([3.]))
    assert_close(f_vjp(jnp.array([3.])), (jnp.array([3.]),))
    assert_close(f_vjp(jnp.array([4.])), (jnp.array([4.]),))


# ports CustomVJPTest.test_symbolic_zero_custom_vjp_basic
def test_symbolic_zero_custom_vjp_basic():
    # CustomVJPPrimal.perturbed is `needs`; a SymbolicZero cotangent is None
    x, y, z = 4., 5., 6.
    i = np.array(7, np.int32)
    f = ab.bind(lambda x, y, z: (x, x), traced=True, name="f")

    def bwd_all(p, g, *, needs):
        assert needs == (True, False, False)
        assert g[0] is not None and g[1] is not None
        return g[0], g[0], g[1]
    f.def_vjp(bwd_all, traced=True, symbolic_zeros=True)
    h = jax.jit(f)
    # the rule's x̄ is the first output's cotangent alone
    assert_close(jax.jacrev(h)(x, y, z), (1., 0.))
    assert_close(jax.jacrev(lambda x: h(x, y, z))(x), (1., 0.))
    jac = jax.jacrev(h, argnums=(0, 1, 2), allow_int=True)(x, i, i)  # ints: never needed
    assert_close([jac[0][0], jac[1][0]], [1., 0.])
    ref = jax.jacrev(lambda x, y, z: (x, x), argnums=(0, 1, 2), allow_int=True)(x, i, i)
    for got, want in zip(jax.tree.leaves(jac)[1:3], jax.tree.leaves(ref)[1:3]):
        assert got.dtype == want.dtype and not np.any(got)

    def bwd_fst(p, g, *, needs):
        assert needs == (True, True, True)
        assert g[0] is not None and g[1] is None
        return g[0], g[0], g[1]
    f.def_vjp(bwd_fst, traced=True, symbolic_zeros=True)
    fst_f = lambda *xs: f(*xs)[0]
    _, vjp = jax.vjp(fst_f, x, y, z)
    assert_close(vjp(x), (x, x, 0.))

    def bwd_snd(p, g, *, needs):
        assert g[0] is None and g[1] is not None
        return g[0], g[0], g[1]
    f.def_vjp(bwd_snd, traced=True, symbolic_zeros=True)
    snd_f = lambda *xs: f(*xs)[1]
    _, vjp = jax.vjp(snd_f, x, y, z)
    assert_close(vjp(x), (0., 0., x))
    _, vjp = jax.vjp(lambda x: snd_f(x, y, z), x)
    assert_close(vjp(x), (0.,))


# ports CustomVJPTest.test_symbolic_zero_custom_vjp_bwd_shape_error
def test_symbolic_zero_custom_vjp_bwd_shape_error():
    f = ab.bind(lambda x, y, z: (x, y, z), traced=True, name="f")
    f.def_vjp(lambda p, g, *, needs: (g[1], g[0], g[2]), traced=True,  # swapped!
              symbolic_zeros=True)
    # JAX's case: the swapped cotangents are symbolic zeros, which here are None and
    # carry no shape, so the swap is harmless and x's cotangent is zero
    assert_close(jax.grad(lambda x, y, z: f(x, y, z)[2].sum())(
        jnp.ones(1), jnp.ones(2), jnp.ones(3)), jnp.zeros(1))
    # swapped arrays are an error naming the op, the argument and both shapes
    with pytest.raises(TypeError, match=r"'f': the vjp rule returned float64\[2\] for "
                                        r"cotangent of input leaf 0; expected float64\[1\]"):
        jax.grad(lambda x, y, z: sum(o.sum() for o in f(x, y, z)))(
            jnp.ones(1), jnp.ones(2), jnp.ones(3))


# ports CustomVJPTest.test_symbolic_zero_custom_vjp
@pytest.mark.parametrize("maybe_jit,maybe_vmap",
                         [(True, True), (True, False), (False, True), (False, False)],
                         ids=["jit_vmap", "jit", "vmap", "plain"])
def test_symbolic_zero_custom_vjp(maybe_jit, maybe_vmap):
    # a SymbolicZero is None (no .shape to check); every output is a jax.Array
    def fn(static_scalar, static_array, dyn_scalar, dyn_array):
        return static_scalar, static_array, static_scalar + dyn_scalar, static_array + dyn_array

    f = ab.bind(fn, traced=True, name="f")

    @f.def_vjp(traced=True, symbolic_zeros=True)
    def _(p, g, *, needs):
        assert needs == (False, False, True, True)
        t_static, t_static_arr, t_dyn_scalar, t_dyn_array = g
        assert t_static is None
        assert t_static_arr is not None and t_dyn_scalar is not None
        assert t_dyn_array is not None
        return p[0] + 90, t_static_arr + 91, t_dyn_scalar + 92, t_dyn_array + 93

    def vmap1(fun):  # vmap over a batch of one
        def run(*args):
            out = jax.vmap(fun)(*jax.tree.map(lambda x: lax.broadcast(x, (1,)), args))
            return jax.tree.map(lambda x: x[0], out)
        return run

    def g(dyn_scalar, dyn_array):
        f_ = vmap1(f) if maybe_vmap else f
        return f_(1., jnp.array([2., 3.]), dyn_scalar, dyn_array)[1:]

    def run(primal_ins, cotangent_outs):
        primal_outs, vjp = jax.vjp(g, *primal_ins)
        return primal_outs, vjp(cotangent_outs)
    if maybe_jit:
        run = jax.jit(run)
    primal_outs, cotangent_ins = run((4., jnp.array([5., 6.])),
                                     (jnp.array([10., 11.]), 7., jnp.array([8., 9.])))
    for out in jax.tree.leaves((primal_outs, cotangent_ins)):
        assert isinstance(out, jax.Array)
    assert_close(primal_outs, (jnp.array([2., 3.]), 5., jnp.array([7., 9.])))
    assert_close(cotangent_ins, (99., jnp.array([101., 102.])))


# ports CustomVJPTest.test_symbolic_zero_custom_vjp_vmap_output
def test_symbolic_zero_custom_vjp_vmap_output():
    f = ab.bind(lambda x, y: (x, y), traced=True, name="f")

    @f.def_vjp(traced=True, symbolic_zeros=True)
    def _(p, g, *, needs):
        assert needs == (True, False)
        assert g[1] is None
        return g
    assert_close(jax.grad(lambda x, y: jax.vmap(f)(x, y)[0].sum())(jnp.ones(3), jnp.ones(3)),
                 jnp.ones(3))


# ports CustomVJPTest.test_symbolic_zero_custom_vjp_custom_pytree
def test_symbolic_zero_custom_vjp_custom_pytree():
    @tree_util.register_pytree_node_class
    class Box:
        def __init__(self, strict, val):
            if strict:  # no wrapper objects reach the rules (JAX: CustomVJPPrimal)
                assert not hasattr(val, "perturbed")
            self.strict = strict
            self.x = val

        def tree_flatten(self):
            return [self.x], self.strict

        @classmethod
        def tree_unflatten(cls, strict, xs):
            return cls(strict, xs[0])

    y = jnp.array(73.)
    f = ab.bind(lambda box, y: box.x * y, traced=True, name="f")
    for argnums, wanted in [(0, (True, False)), (1, (False, True))]:
        def rule(p, g, *, needs, wanted=wanted):
            assert needs == wanted
            box, y = p
            return Box(False, y * g), box.x * g
        f.def_vjp(rule, traced=True, symbolic_zeros=True)
        ans = jax.grad(f, argnums=argnums)(Box(False, jnp.array(72.)), y)
        assert_close(ans.x if argnums == 0 else ans, 73. if argnums == 0 else 72.)
    f.def_vjp(lambda p, g: (Box(True, p[1] * g), p[0].x * g), traced=True)
    assert_close(jax.grad(f)(Box(True, jnp.array(72.)), y).x, 73.)


# ports CustomVJPTest.test_symbolic_zeros_memoization_caching
def test_symbolic_zeros_memoization_caching():
    # two zero patterns of the same primitive, evaluated from its jaxpr
    f = ab.bind(lambda x, y: x * y, traced=True, name="f")
    f.def_vjp(lambda p, z_bar, *, needs: (z_bar, None), traced=True, symbolic_zeros=True)
    f_ = jax.extend.core.jaxpr_as_fun(jax.make_jaxpr(f)(2., 3.))
    y, vjp = jax.vjp(lambda x, y: f_(x, y)[0], 2., 3.)
    assert_close((y, vjp(1.)), (6., (1., 0.)))
    y, vjp = jax.vjp(lambda x: f_(x, 3.)[0], 2.)
    assert_close((y, vjp(1.)), (6., (1.,)))


# ports CustomVJPTest.test_run_rules_more_than_once
def test_run_rules_more_than_once():
    # JAX's fwd saves None or [] depending on which input is perturbed: a host fwd
    # with empty residuals, in a scan under grad
    f = ab.bind(lambda x, y: x + y, shape=ab.like(0), name="f")
    f.def_fwd(lambda x, y: (x + y, ()), residuals=())
    f.def_bwd(lambda res, ct: (ct, ct))

    @jax.grad
    def g(x):
        (out, _), _ = lax.scan(lambda xy, _: ((f(*xy), xy[0]), None), (x, 1.), xs=None,
                               length=2)
        return out
    assert_close(g(1.), 2.)


# ports CustomVJPTest.test_symbolic_zeros_remat
def test_symbolic_zeros_remat():
    f = ab.bind(lambda x: x, traced=True, name="f")
    f.def_vjp(lambda p, g, *, needs: (g,), traced=True, symbolic_zeros=True)
    foo = jax.remat(lambda x: f(f(x)))
    assert_close(jax.grad(foo)(3.), 1.)


# ports CustomVJPTest.test_nones_representing_zeros_in_subtrees_returned_by_bwd
def test_nones_representing_zeros_in_subtrees_returned_by_bwd():
    f = custom_vjp(lambda x: x[0], lambda p, z_bar: ((z_bar, (None, None)),))
    assert_close(jax.grad(f)((1.0, (2.0, 3.0))), (1.0, (0.0, 0.0)))


# ports CustomVJPTest.test_pytree_nones_returned_by_bwd
def test_pytree_nones_returned_by_bwd():
    f = custom_vjp(lambda x: x[0], lambda p, z_bar: ((z_bar, (None, None)),))
    g = jax.grad(f)((1.0, (2.0, None)))
    assert jax.tree.structure(g) == jax.tree.structure((1.0, (2.0, None)))
    assert_close(g, (1.0, (0.0, None)))


# ports CustomVJPTest.test_bwd_rule_shape_mismatch
def test_bwd_rule_shape_mismatch():
    foo = custom_vjp(lambda x, y: x, lambda p, g: (jnp.zeros(3), jnp.zeros(3)), name="foo")
    with pytest.raises(TypeError, match=r"'foo': the vjp rule returned float64\[3\] for "
                                        r"cotangent of input leaf 1; expected float64\[4\]"):
        jax.grad(lambda x, y: foo(x, y * y).sum(), 1)(jnp.ones(3), jnp.ones(4))


# ports CustomVJPTest.test_bwd_rule_can_produce_list_or_tuple
def test_bwd_rule_can_produce_list_or_tuple():
    f = custom_vjp(lambda x, y: x * y, lambda p, g: [g * p[1], p[0] * g])
    assert_close(jax.grad(f, (0, 1))(1., 2.), (2., 1.))


# ports CustomVJPTest.test_optimize_remat_gh21303
def test_optimize_remat_gh21303():
    # optimize_remat is JAX's flag; the case is the op under remat with value_and_grad
    f = custom_vjp(jnp.tan, lambda p, g: (jnp.cos(p[0]) * g,))  # JAX's (untrue) bwd
    v, g = jax.value_and_grad(lambda x: jax.remat(f)(x) ** 2)(3.2)
    assert_close(v, jnp.tan(3.2) ** 2)
    assert_close(g, 2 * jnp.tan(3.2) * jnp.cos(3.2))


# ports CustomVJPTest.test_optimize_remat_multiple_args
def test_optimize_remat_multiple_args():
    # the residuals of JAX's fwd, kept by a host fwd/bwd pair
    f_ = lambda x, y: np.sin(x) * y
    f = ab.bind(f_, shape=ab.like(0), name="f")
    f.def_fwd(lambda x, y: (f_(x, y), (np.cos(x), np.sin(x), y)),
              residuals=lambda x, y: (x, x, y))
    f.def_bwd(lambda res, g: (res[0] * g * res[2], res[1] * g))
    x, y = 3.2, 1.0
    assert_close(jax.grad(f, argnums=(0, 1))(x, y),
                 jax.grad(lambda x, y: jnp.sin(x) * y, argnums=(0, 1))(x, y))


# ports CustomVJPTest.test_optimize_remat_kwargs
def test_optimize_remat_kwargs():
    # a fwd rule with a keyword of its own that is never passed
    def f_fwd(x, y, *, keyword=False):
        del keyword
        return np.sin(x) * y, (np.cos(x), np.sin(x), y)
    f = ab.bind(lambda x, y: np.sin(x) * y, shape=ab.like(0), name="f")
    f.def_fwd(f_fwd, residuals=lambda x, y: (x, x, y))
    f.def_bwd(lambda res, g: (res[0] * g * res[2], res[1] * g))
    assert_close(jax.grad(f)(3.2, 1.0), jnp.cos(3.2))


# ports CustomVJPTest.test_optimize_remat_custom_vmap
def test_optimize_remat_custom_vmap():
    # JAX's vmap rule (on fwd) doubles the primal output; derivatives of the batched
    # op come from the unbatched vjp rule, so grad under vmap is the rule's
    f = custom_vjp(lambda x, y: jnp.sin(x) * y,
                   lambda p, g: (jnp.cos(p[0]) * g * p[1], jnp.sin(p[0]) * g))
    f.def_vmap(lambda n, in_batched, x, y: (np.array([2.0]) * f(x, y), True), traced=True)
    x, y = jnp.linspace(0.0, 1.0, 5), jnp.linspace(2.0, 5.0, 5)
    assert_close(jax.jit(jax.vmap(jax.grad(f)))(x, y), jnp.cos(x) * y)
    assert_close(jax.vmap(f)(x, y), 2.0 * jnp.sin(x) * y)


# ports CustomVJPTest.test_dce
def test_dce():
    # the half of JAX's test that inspects the call_jaxpr param of custom_vjp_call
    # after pe.dce_jaxpr is about JAX internals; the numbers of each output alone:
    f = custom_vjp(lambda x, y: (jnp.sin(x), x + jnp.cos(y)),
                   lambda p, cts: (2.0 * jnp.cos(p[0]) * cts[0] + 1.5 * cts[1],
                                   -0.5 * jnp.sin(p[1]) * cts[1]))
    x, y = 0.1, -1.3
    assert_close(jax.grad(lambda x, y: f(x, y)[0], argnums=(0, 1))(x, y),
                 (2.0 * jnp.cos(x), 0.0))
    assert_close(jax.grad(lambda x, y: f(x, y)[1], argnums=(0, 1))(x, y),
                 (1.5, -0.5 * jnp.sin(y)))


# ports CustomVJPTest.test_resolve_kwargs_error_message
def test_resolve_kwargs_error_message():
    def rule(p, cts, **kw):
        raise AssertionError("should not be executed")
    f = custom_vjp(lambda x, y, *, z=None: (jnp.sin(x), x + jnp.cos(y)), rule)
    # anybind's error names the op as well as the missing argument
    with pytest.raises(TypeError, match="anybind op 'f'.*missing 1 required positional "
                                        "argument: 'y'"):
        f(0.5)
    # JAX cannot resolve the keyword z to a position; here it is a static keyword
    assert_close(f(0.5, 0.1, z=1.0), (jnp.sin(0.5), 0.5 + jnp.cos(0.1)))


# ports CustomVJPTest.test_pretty_print
def test_pretty_print():
    # JAX prints a custom_vjp_call with its fwd and bwd; an op is one primitive
    # named after the function, whose call signature shows in the jaxpr
    f = custom_vjp(lambda x: x + 1, lambda p, g: (g,), name="f")
    jaxpr = jax.make_jaxpr(f)(jnp.array([4.2], dtype=jnp.float32))
    (eqn,) = jaxpr.eqns
    assert eqn.primitive.name == "f"
    assert "call=f(float32[1]) -> (float32[1])" in jaxpr.pretty_print(use_color=False)


# The cases below are those JAX's subclass CustomVJP3Test (CustomVJPTest under
# jax_custom_vjp3) adds to the class with an anybind meaning; its
# test_hityped_tracers (JAX's hijax types) and
# test_expand_stages_call_without_inlining (JAX's lowering) have none.

# ports CustomVJP3Test.test_overbatched_fwd_rule_error
def test_overbatched_fwd_rule_error():
    # JAX raises: a fwd rule's output more batched than the (constant) primal's.
    # A host fwd runs on the batch it is given and is checked against the declared
    # output, so here grad works and gives the bwd rule's answer
    f = ab.bind(lambda x: np.zeros(x.shape, x.dtype), shape=ab.like(0), name="f")
    f.def_fwd(lambda x: (x * 0., x), residuals=lambda x: x)
    f.def_bwd(lambda res, g: (g,))
    assert_close(jax.grad(lambda x: jax.vmap(f)(x).sum())(jnp.arange(3.)), jnp.ones(3))


# ports CustomVJP3Test.test_jvp_error_symbolic_zeros
def test_jvp_error_symbolic_zeros():
    # JAX: "can't apply forward-mode autodiff (jvp) to a custom_vjp function"; here
    # the jvp is the transpose of the traced (symbolic-zeros) vjp rule
    f = ab.bind(jnp.sin, traced=True, name="f")
    f.def_vjp(lambda p, g, *, needs: (2 * jnp.cos(p[0]) * g,), traced=True,
              symbolic_zeros=True)
    assert_close(jax.jvp(f, (3.,), (1.,)), (jnp.sin(3.), 2 * jnp.cos(3.)))
