"""The fragment service on Ray: the large-payload path of the replay service.

- :mod:`~replaystore.ray.fragments.client`: :class:`FragmentClient` (``client.fragments``);
- :mod:`~replaystore.ray.fragments.service`: the service's fragment calls around a
  :class:`~replaystore.fragments.FragmentBuffer`;
- :mod:`~replaystore.ray.fragments.store`, :mod:`~replaystore.ray.fragments.node_stores`: the
  payload stores (one, or one per node);
- :mod:`~replaystore.ray.fragments.node_loaders`: per-node loader
  pools that read fetched fragments in parallel (the pools users create: :mod:`replaystore.ray.loader`).
"""
