"""A legacy script using apex in every way check must see (read by tests, never run)."""
import textwrap

SAMPLE = textwrap.dedent("""
    import sys
    import apex.amp as A
    from apex import amp
    from apex.parallel import DistributedDataParallel as DDP
    from apex.fp16_utils import *
    from apex.contrib.xentropy import SoftmaxCrossEntropyLoss
    from apex.RNN import LSTM
    import amp_C

    open(sys.argv[0] + ".ran", "w").write("executed")  # must never run
    model, opt = A.initialize(None, None, opt_level="O2")
    with amp.scale_loss(1.0, opt) as scaled:
        pass
    amp._amp_state.loss_scalers[0].loss_scale()
    value = to_python_float(scaled)
    handle = amp.init()
    amp.no_such_function()
    amp_C.multi_tensor_l2norm
    print(apex.__version__ if False else DDP)
""")
