"""What a method folder builds with: the contract (``method``: ``Method``, ``DataInfo``, ``EpochContext``
and helpers such as ``embed_crops`` and ``bn_mlp``), every loss (``losses``), the clustering maths of
PCL, SeLa, SwAV and DeepCluster (``clustering``), MoCo's building blocks (``moco``), memory queues
(``queue``) and momentum encoders (``momentum``). A method imports this kit, ``sslbench.distributed``,
``sslbench.backbones`` and ``sslbench.errors``, and nothing of a stage."""
