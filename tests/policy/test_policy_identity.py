"""A policy's identity (name plus configuration and functions) is what processes agree on."""

import numpy as np

import jaxpace as jp
from jaxpace.policy.adaptive import reference
from jaxpace.runtime import consensus


def _zero_update(obs, state):
    return np.zeros(len(obs.earliness_s)), state


def _half_update(obs, state):
    return 0.5 * np.nan_to_num(np.asarray(obs.earliness_s)), state


def test_same_settings_same_identity_and_different_settings_differ():
    assert jp.adaptive(window=8).identity == jp.adaptive(window=8).identity
    assert jp.adaptive(window=8).identity != jp.adaptive(window=9).identity
    assert jp.fixed(0.001).identity != jp.fixed(0.002).identity
    assert jp.no_pacing().identity != jp.fixed(0.0).identity
    # The reference and the fast path compute the same, but are different code.
    assert reference(window=8).identity != jp.adaptive(window=8).identity


def test_two_custom_policies_are_not_both_custom():
    a = jp.PacingPolicy(lambda n: None, _zero_update, max_delay_s=0.01)
    b = jp.PacingPolicy(lambda n: None, _half_update, max_delay_s=0.01)
    assert a.name == b.name == "custom"
    assert a.identity != b.identity
    assert a.identity == jp.PacingPolicy(lambda n: None, _zero_update, max_delay_s=0.01).identity
    c = a._replace(config={"gain": 0.5})
    assert c.identity != a.identity  # a custom policy may name its configuration


def test_processes_agree_on_the_identity_not_the_bare_name():
    """The settings fingerprint that `jaxpace` compares across processes at the first trace
    differs for two custom policies that share the default name (it did not when only the
    name was compared)."""
    a = jp.PacingPolicy(lambda n: None, _zero_update, max_delay_s=0.01)
    b = jp.PacingPolicy(lambda n: None, _half_update, max_delay_s=0.01)
    fa = consensus.fingerprint(jp.Pacer(policy=a).agreed_settings())
    fb = consensus.fingerprint(jp.Pacer(policy=b).agreed_settings())
    assert fa != fb
    assert "_zero_update" in fa and "_half_update" in fb
