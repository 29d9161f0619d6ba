"""load_model skips weight init while it builds the module tree, for its own thread only: another
thread initialising its own weights meanwhile gets real values, and nn.init is left as it was."""

import sys
import threading

import torch
from torch import nn

from salactl.runtime.loader import load_model, meta_model
from salactl.runtime.presets import preset

INITS = {"normal_": nn.init.normal_, "uniform_": nn.init.uniform_,
         "kaiming_uniform_": nn.init.kaiming_uniform_}


def test_another_threads_nn_init_calls_during_load_model_all_take_effect():
    stop = threading.Event()
    calls, ineffective = [0], []

    def init_own_weights():
        while not stop.is_set():
            for name in INITS:
                w = torch.full((8, 8), 7.0)
                getattr(nn.init, name)(w)
                if bool((w == 7.0).all()):
                    ineffective.append(name)
            calls[0] += 1

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)            # hand the GIL over often, so the threads interleave
    worker = threading.Thread(target=init_own_weights)
    worker.start()
    try:
        for _ in range(3):
            load_model("sala-nano")
            meta_model(preset("sala-9b"))      # the 9B module tree: the longest build on this path
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(switch)
    assert calls[0] > 50, "the threads barely overlapped; the test proves nothing"
    assert ineffective == []
    assert {n: getattr(nn.init, n) for n in INITS} == INITS
