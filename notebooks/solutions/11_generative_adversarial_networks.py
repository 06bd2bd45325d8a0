"""Reference answers to the exercises of notebooks/11_generative_adversarial_networks (try them
first)."""
import numpy as np


def optimal_discriminator(x, mu_d, cov_d, mu_g, cov_g):
    """D*(x) for each row of x (n, 2): p_data / (p_data + p_G)."""
    def density(mu, cov):
        d = x - mu
        quad = np.einsum("ni,ij,nj->n", d, np.linalg.inv(cov), d)
        return np.exp(-0.5 * quad) / np.sqrt((2 * np.pi) ** len(mu) * np.linalg.det(cov))

    p_data, p_gen = density(mu_d, cov_d), density(mu_g, cov_g)
    return p_data / (p_data + p_gen)


def generator_loss_derivatives(s):
    """(d/ds log(1 - sigmoid(s)), d/ds -log sigmoid(s)), element-wise."""
    D = 1 / (1 + np.exp(-s))
    # log(1 - σ(s)) = -log(1 + e^s): derivative -σ(s), about 0 when D rejects (s → -∞);
    # -log σ(s) = log(1 + e^-s): derivative -(1 - σ(s)), about -1 there
    return -D, -(1 - D)


def another_generator_weight(A):
    """A (2, 2) W != A with Wᵀ W = Aᵀ A."""
    theta = 0.7
    Q = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    return Q @ A  # (QA)ᵀ QA = Aᵀ Qᵀ Q A = Aᵀ A for any orthogonal Q (-A works too)


def value_at_optimal_discriminator(p, q):
    """max over D of sum p log D + q log(1 - D), for probability vectors p and q."""
    d_star = p / (p + q)
    return float(np.sum(p * np.log(d_star) + q * np.log(1 - d_star)))
