"""Hugging Face transformers' Trainer with `half_precision_backend="apex"`, unchanged, under `apexlite run`.

transformers 4.57.x (the last line with the apex backend) checks for apex by its distribution metadata,
imports `apex.amp`, calls `amp.initialize(model, optimizer, opt_level=args.fp16_opt_level)` after
building its LR scheduler, then `amp.scale_loss` and `amp.master_params` for clipping. A tiny GPT-2
built from a config (no download) trains a few steps on CPU at O1 (plain SGD, whose update is linear in
the gradients, so the comparison is sharp); the same script first trains the same model in fp32
without apex, and the apex run must follow it.
"""
import json
import textwrap

import pytest

from tests.libraries._libs import python_with, run_python

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile, warnings
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from transformers.utils import is_apex_available


    def train(apex_level):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
        generator = torch.Generator().manual_seed(1)
        data = []
        for _ in range(16):
            ids = torch.randint(0, 64, (16,), generator=generator)
            data.append({"input_ids": ids, "labels": ids})
        initial = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        extra = {} if apex_level is None else dict(fp16=True, half_precision_backend="apex",
                                                   fp16_opt_level=apex_level)
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(output_dir=out, use_cpu=True, max_steps=4, per_device_train_batch_size=4,
                                     optim="sgd", learning_rate=0.5, max_grad_norm=1.0, logging_steps=1, report_to=[],
                                     save_strategy="no", seed=0, disable_tqdm=True, **extra)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer = Trainer(model=model, args=args, train_dataset=data)
                trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        params = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        scheduler_warnings = [str(w.message).split(".")[0] for w in caught if "lr_scheduler" in str(w.message)
                              or "learning rate scheduler" in str(w.message)]
        return losses, params, initial, scheduler_warnings


    reference_losses, reference_params, _, _ = train(None)
    losses, params, initial, scheduler_warnings = train(sys.argv[1])
    from apexlite.amp.session import current_session
    session = current_session()
    print(json.dumps({
        "apex_available": bool(is_apex_available()), "opt_level": session.properties.opt_level,
        "amp_steps": session.stats.steps, "skipped": session.stats.skipped_steps,
        "losses": losses, "reference_losses": reference_losses,
        "moved": (reference_params - initial).norm().item(),
        "relative_error": ((params - reference_params).norm() / (reference_params - initial).norm()).item(),
        "scheduler_warnings": scheduler_warnings,
    }))
""")


@pytest.mark.slow
def test_hf_trainer_apex_backend_o1_trains_like_fp32(tmp_path):
    python = python_with("transformers", "accelerate")
    script = tmp_path / "hf_trainer_apex.py"
    script.write_text(SCRIPT)
    done = run_python(python, ["-m", "apexlite", "run", str(script), "O1"], tmp_path)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["apex_available"] is True and report["opt_level"] == "O1"
    assert report["amp_steps"] == 4 and report["skipped"] == 0 and len(report["losses"]) == 4
    for got, want in zip(report["losses"], report["reference_losses"]):
        assert got == pytest.approx(want, rel=2e-3)
    # the params' displacement from their initial values matches fp32 training's (measured: 5e-4 relative)
    assert report["moved"] > 0.1 and report["relative_error"] < 1e-2
    # apex bound a new step at O1 (casts off during the update), after the Trainer built its scheduler:
    # torch's scheduler then warned, and does under apexlite too (tests/amp/test_scheduler_step.py)
    assert report["scheduler_warnings"] == ["Seems like `optimizer"]
