import numpy as np, time, widelimit as wl
from widelimit import datasets
X,tr=datasets.hierarchical(n_children=2, dim=3, points_per_child=2, child_scale=(1.5,1.5), n_parent_only=1, n_inactive=1, seed=0)
print(X.shape, wl.solve(X,lam=0.5).width)
for k in (1,2,3):
    t=time.time(); s=wl.solve(X,lam=0.5,width=k,time_limit=60,rel_tol=1e-6)
    print(k,s.status,s.value,s.rel_gap,s.n_nodes,round(time.time()-t,1))
    print(np.round(s.dictionary@np.vstack([tr['parent'],tr['children']]).T,3))
