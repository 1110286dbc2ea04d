"""widelimit against the real SAE libraries: SAEs built from a config (no downloads) with SAELens,
dictionary_learning and sparsify, saved with the library's own save function; widelimit loads the
object in memory and the folder, and its encoder / objective match the library's forward pass / loss."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import widelimit as wl
from fixtures import libraries
from widelimit.sae.formats import as_sae, load_sae, save_saelens
from widelimit.sae.model import SAE, SAEFormatError

warnings.filterwarnings("ignore", message=".*Triton.*")
D_IN, D_SAE = 6, 10


def _perturb(module, seed=0, scale=0.2):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def _x(seed=1, n=40, dtype=torch.float64):
    return torch.randn(n, D_IN, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _objective(sae: SAE, X, lam):
    f = sae.encode(np.asarray(X, dtype=np.float64))
    return wl.sae_objective(X, sae.unit_dictionary(), f * sae.decoder_norms(), sae.b_dec, lam=lam).value


# ---- SAELens -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk", "gated"])
def test_saelens_objects_and_folders_encode_like_sae_lens(tmp_path, arch):
    sl = libraries.sae_lens()
    cls = {"standard": (sl.StandardSAE, sl.StandardSAEConfig, {}), "jumprelu": (sl.JumpReLUSAE, sl.JumpReLUSAEConfig, {}),
           "topk": (sl.TopKSAE, sl.TopKSAEConfig, {"k": 3}), "gated": (sl.GatedSAE, sl.GatedSAEConfig, {})}[arch]
    m = _perturb(cls[0](cls[1](d_in=D_IN, d_sae=D_SAE, dtype="float64", **cls[2])))
    if arch == "jumprelu":
        with torch.no_grad():
            m.threshold.copy_(torch.linspace(0.0, 0.4, D_SAE, dtype=torch.float64))
    x = _x()
    want = m.encode(x).detach().numpy()
    m.save_model(tmp_path / "s")
    for sae in (as_sae(m), load_sae(tmp_path / "s"), load_sae(tmp_path / "s" / "sae_weights.safetensors")):
        assert sae.architecture == arch
        np.testing.assert_allclose(sae.encode(x.numpy()), want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(sae.decode(want), m.decode(torch.as_tensor(want)).detach().numpy(), atol=1e-12)
    # and back: SAELens reads widelimit's folder
    save_saelens(load_sae(tmp_path / "s"), tmp_path / "w")
    back = sl.SAE.load_from_disk(tmp_path / "w")
    np.testing.assert_allclose(back.encode(x).detach().numpy(), want, atol=1e-12)


def test_saelens_standard_training_loss_and_l1_coefficient_from_metadata(tmp_path):
    sl = libraries.sae_lens()
    from sae_lens.saes.sae import TrainStepInput

    m = _perturb(sl.StandardTrainingSAE(sl.StandardTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, l1_coefficient=0.7,
                                                                     dtype="float64")))
    x = _x(2)
    out = m.training_forward_pass(TrainStepInput(sae_in=x, coefficients={"l1": 0.7}, dead_neuron_mask=None,
                                                 n_training_steps=0, is_logging_step=False))
    m.save_inference_model(tmp_path / "s")
    assert "l1_coefficient" not in json.loads((tmp_path / "s" / "cfg.json").read_text())  # only in metadata
    for sae in (as_sae(m), load_sae(tmp_path / "s")):
        assert sae.l1_coefficient == 0.7
        # SAELens' loss: mean ||x - x_hat||^2 + l1_coefficient * mean sum_d f_d ||W_dec,d|| = our objective at lam = l1/2
        assert _objective(sae, x.numpy(), 0.35) == pytest.approx(float(out.loss.detach()), rel=1e-12)
    cert = wl.certify_sae(x.numpy(), m)  # lam read from the metadata
    assert cert.lam == 0.35


def test_saelens_batchtopk_is_read_in_its_inference_form(tmp_path):
    sl = libraries.sae_lens()
    m = _perturb(sl.BatchTopKTrainingSAE(sl.BatchTopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=2, dtype="float64")))
    with torch.no_grad():
        m.topk_threshold.fill_(0.3)
    m.save_inference_model(tmp_path / "b")
    ref = sl.SAE.load_from_disk(tmp_path / "b")
    x = _x(3)
    for sae in (as_sae(m), load_sae(tmp_path / "b")):
        assert (sae.architecture, sae.training_architecture) == ("jumprelu", "batchtopk")
        np.testing.assert_allclose(sae.encode(x.numpy()), ref.encode(x).detach().numpy(), atol=1e-12)


# ---- dictionary_learning ------------------------------------------------------------------


def _dl_models():
    dic, topk, btk, mat = libraries.dictionary_learning()
    ae = dic.AutoEncoder(D_IN, D_SAE).double()
    jr = dic.JumpReluAutoEncoder(D_IN, D_SAE).double()
    tk = topk.AutoEncoderTopK(D_IN, D_SAE, 3).double()
    bt = btk.BatchTopKSAE(D_IN, D_SAE, 3).double()
    mt = mat.MatryoshkaBatchTopKSAE(D_IN, D_SAE, 3, [4, 6]).double()
    gt = dic.GatedAutoEncoder(D_IN, D_SAE).double()
    for m in (ae, jr, tk, bt, mt, gt):
        _perturb(m, seed=5, scale=0.1)
    with torch.no_grad():
        jr.threshold.copy_(torch.linspace(0.0, 0.3, D_SAE, dtype=torch.float64))
        bt.threshold.fill_(0.1)
        mt.threshold.fill_(0.1)
    return {"AutoEncoder": (ae, "standard"), "JumpReluAutoEncoder": (jr, "jumprelu"),
            "AutoEncoderTopK": (tk, "topk"), "BatchTopKSAE": (bt, "batchtopk"),
            "MatryoshkaBatchTopKSAE": (mt, "matryoshka"), "GatedAutoEncoder": (gt, "gated")}


def test_dictionary_learning_objects_and_files_encode_like_the_library(tmp_path):
    x = _x(4)
    for cls, (m, arch) in _dl_models().items():
        want = m.encode(x).detach().numpy()
        d = tmp_path / cls
        d.mkdir()
        torch.save(m.state_dict(), d / "ae.pt")  # what dictionary_learning's trainSAE writes
        cfg = {"trainer": {"dict_class": cls, "activation_dim": D_IN, "dict_size": D_SAE, "l1_penalty": 0.1}}
        (d / "config.json").write_text(json.dumps(cfg))
        for sae in (as_sae(m), load_sae(d), load_sae(d / "ae.pt")):
            assert sae.architecture == arch, cls
            np.testing.assert_allclose(sae.encode(x.numpy()), want, atol=1e-12, err_msg=cls)
            np.testing.assert_allclose(sae.decode(want), m.decode(torch.as_tensor(want)).detach().numpy(), atol=1e-12)


def test_dictionary_learning_standard_loss():
    dic, *_ = libraries.dictionary_learning()
    m = dic.AutoEncoder(D_IN, D_SAE).double()  # unit decoder columns, as the library keeps them
    _perturb(m, seed=7, scale=0.1)
    with torch.no_grad():
        m.decoder.weight.div_(m.decoder.weight.norm(dim=0, keepdim=True))
    x = _x(5)
    x_hat, f = m(x, output_features=True)
    loss = float((x - x_hat).pow(2).sum(-1).mean() + 0.3 * f.norm(p=1, dim=-1).mean())  # StandardTrainer.loss
    assert _objective(as_sae(m), x.numpy(), 0.15) == pytest.approx(loss, rel=1e-12)


# ---- sparsify ----------------------------------------------------------------------------------


def test_sparsify_object_and_folder_encode_like_sparsify(tmp_path):
    sp = libraries.sparsify()
    m = _perturb(sp.SparseCoder(D_IN, sp.SparseCoderConfig(num_latents=D_SAE, k=3), dtype=torch.float64), seed=3)
    x = _x(6)
    enc = m.encode(x)
    want = torch.zeros(x.shape[0], D_SAE, dtype=torch.float64).scatter(-1, enc.top_indices, enc.top_acts.detach()).numpy()
    m.save_to_disk(tmp_path / "sp")
    for sae in (as_sae(m), load_sae(tmp_path / "sp"), load_sae(tmp_path / "sp" / "sae.safetensors")):
        assert (sae.architecture, sae.k) == ("topk", 3)
        np.testing.assert_allclose(sae.encode(x.numpy()), want, atol=1e-12)
        np.testing.assert_allclose(sae.decode(want), m.decode(enc.top_acts, enc.top_indices).detach().numpy(),
                                   atol=1e-12)


# ---- generic objects and refusals -----------------------------------------------------------------


def test_any_module_with_w_dec_and_b_dec():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.W_dec = torch.nn.Parameter(torch.eye(3, dtype=torch.float64))
            self.b_dec = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
            self.W_enc = torch.nn.Parameter(torch.eye(3, dtype=torch.float64))
            self.b_enc = torch.nn.Parameter(-0.5 * torch.ones(3, dtype=torch.float64))

    with pytest.raises(SAEFormatError, match="name its architecture"):
        as_sae(Tiny())
    s = as_sae(Tiny(), architecture="standard")
    np.testing.assert_array_equal(s.encode(np.array([[1.0, 0.2, -1.0]])), [[0.5, 0.0, 0.0]])
    with pytest.raises(SAEFormatError, match="not an SAE"):
        as_sae(object())


def test_metrics_agree_with_sae_lens_evals():
    sl = libraries.sae_lens()
    from widelimit.sae.saelens_evals import saelens_sparsity_and_variance

    m = _perturb(sl.StandardSAE(sl.StandardSAEConfig(d_in=D_IN, d_sae=D_SAE, dtype="float64")), seed=9)
    X = _x(7, n=256).numpy() + 0.5
    # one eval batch: SAELens averages relative_reconstruction_bias per batch, widelimit takes the ratio of the
    # means over all tokens (Gao et al.'s definition); they coincide on one batch
    ref = saelens_sparsity_and_variance(m, X, ctx=16, batch_prompts=16)
    assert ref["n_tokens"] == 256
    cert = wl.certify_sae(X, m, lam=0.1, device="cpu")
    for k in ("mse", "explained_variance", "explained_variance_legacy", "cossim", "l2_ratio",
              "relative_reconstruction_bias", "l0", "l1"):
        assert cert.metrics[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), k
    assert cert.metrics["explained_variance_legacy"] != pytest.approx(cert.metrics["explained_variance"], rel=1e-6)
