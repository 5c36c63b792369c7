{{- /* The Deployment of a version served by an engine server (a version with `engine:`):
one pod, the engine container (vLLM, trtllm-serve, SGLang or llama-server: its image, its
args, its GPUs, the model from a read-only PersistentVolumeClaim, probes on its health path)
and the Graylane worker, which streams each generation to the engine over the pod's
loopback (`--endpoint VARIANT=http://127.0.0.1:PORT`). The worker loads no artifact: no
init container, no registry, no trusted keys (it refuses them without --from-registry).
Called with (dict "root" $ "model" $m "version" $v "name" $name). */}}
{{- define "graylane.engineWorker" -}}
{{- $root := .root }}
{{- $m := .model }}
{{- $v := .version }}
{{- $e := mergeOverwrite (deepCopy $root.Values.engineDefaults) $v.engine }}
{{- $kinds := list "vllm" "trtllm" "sglang" "llamacpp" }}
{{- if not (has $e.kind $kinds) }}
{{- fail (printf "models %s %s: engine.kind must be one of %s, not %v" $m.name $v.version (join ", " $kinds) $e.kind) }}
{{- end }}
{{- if $v.gpuClass }}
{{- fail (printf "models %s %s: an engine-served version takes no gpuClass (engine.gpus is its GPUs)" $m.name $v.version) }}
{{- end }}
{{- if and $e.stopDelaySeconds (semverCompare "<1.30-0" $root.Capabilities.KubeVersion.Version) }}
{{- fail "engine.stopDelaySeconds is a preStop sleep, Kubernetes 1.30 or later: set it to 0" }}
{{- end }}
{{- $port := int $e.port }}
apiVersion: apps/v1
kind: Deployment
metadata:
  namespace: {{ $root.Release.Namespace }}
  name: {{ .name }}
  labels:
    app.kubernetes.io/name: graylane
    app.kubernetes.io/part-of: graylane
    app.kubernetes.io/component: worker
    graylane.io/model: {{ $m.name }}
    graylane.io/version: {{ $v.version | quote }}
spec:
  replicas: {{ $v.replicas | default 1 }}
  selector:
    matchLabels:
      app.kubernetes.io/name: graylane
      app.kubernetes.io/component: worker
      graylane.io/model: {{ $m.name }}
      graylane.io/version: {{ $v.version | quote }}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: graylane
        app.kubernetes.io/part-of: graylane
        app.kubernetes.io/component: worker
        graylane.io/model: {{ $m.name }}
        graylane.io/version: {{ $v.version | quote }}
      annotations:
        prometheus.io/scrape: 'true'
        prometheus.io/port: '9100'
    spec:
      automountServiceAccountToken: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 10001
        runAsGroup: 10001
        fsGroup: 10001
        seccompProfile:
          type: RuntimeDefault
      terminationGracePeriodSeconds: {{ $e.terminationGracePeriodSeconds }}
      {{- with $e.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if $e.gpus }}
      tolerations:
      - key: nvidia.com/gpu
        operator: Exists
        effect: NoSchedule
      {{- end }}
      containers:
      - name: engine
        image: {{ required (printf "models %s %s: engine.image" $m.name $v.version) $e.image }}
        imagePullPolicy: IfNotPresent
        {{- with $e.command }}
        command:
        {{- toYaml . | nindent 8 }}
        {{- end }}
        args:
        {{- with $e.args }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        - --host
        - 0.0.0.0
        - --port
        - {{ $port | quote }}
        env:
        {{- toYaml $root.Values.engineDefaults.env | nindent 8 }}
        {{- with $v.engine.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        ports:
        - name: engine
          containerPort: {{ $port }}
          protocol: TCP
        startupProbe:
          httpGet:
            path: {{ $e.probes.path }}
            port: engine
          {{- toYaml $e.probes.startup | nindent 10 }}
        livenessProbe:
          httpGet:
            path: {{ $e.probes.path }}
            port: engine
          {{- toYaml $e.probes.liveness | nindent 10 }}
        readinessProbe:
          httpGet:
            path: {{ $e.probes.path }}
            port: engine
          {{- toYaml $e.probes.readiness | nindent 10 }}
        {{- if $e.stopDelaySeconds }}
        lifecycle:
          preStop:
            sleep:
              seconds: {{ $e.stopDelaySeconds }}
        {{- end }}
        resources:
          requests:
            {{- toYaml $e.resources.requests | nindent 12 }}
          limits:
            {{- toYaml $e.resources.limits | nindent 12 }}
            {{- if $e.gpus }}
            nvidia.com/gpu: {{ $e.gpus | quote }}
            {{- end }}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          runAsNonRoot: true
          capabilities:
            drop:
            - ALL
          seccompProfile:
            type: RuntimeDefault
        volumeMounts:
        - name: engine-model
          mountPath: {{ $e.modelPath }}
          readOnly: true
        - name: engine-tmp
          mountPath: /tmp
        - name: engine-shm
          mountPath: /dev/shm
      - name: worker
        image: {{ include "graylane.image" $root }}
        imagePullPolicy: IfNotPresent
        command:
        - graylane
        - serve
        - worker
        - --model
        - {{ $m.name }}
        - --version
        - {{ $v.version | quote }}
        - --endpoint
        - {{ required (printf "models %s %s: engine.variant" $m.name $v.version) $e.variant }}=http://127.0.0.1:{{ $port }}
        - --engine
        - {{ $e.kind }}
        {{- with $e.version }}
        - --engine-version
        - {{ . | toString | quote }}
        {{- end }}
        {{- with $e.servedModel }}
        - --engine-model
        - {{ . }}
        {{- end }}
        {{- with $e.slots }}
        - --engine-slots
        - {{ . | quote }}
        {{- end }}
        envFrom:
        - configMapRef:
            name: graylane-config
        env:
        - name: GRAYLANE_SASL_USERNAME_FILE
          value: /etc/graylane/kafka-login/username
        - name: GRAYLANE_SASL_PASSWORD_FILE
          value: /etc/graylane/kafka-login/password
        - name: GRAYLANE_SASL_MECHANISM_FILE
          value: /etc/graylane/kafka-login/mechanism
        ports:
        - name: metrics
          containerPort: 9100
          protocol: TCP
        startupProbe:
          httpGet:
            path: /healthz
            port: metrics
          periodSeconds: 5
          failureThreshold: 60
        livenessProbe:
          httpGet:
            path: /healthz
            port: metrics
          periodSeconds: 10
          timeoutSeconds: 2
          failureThreshold: 3
        readinessProbe:
          httpGet:
            path: /readyz
            port: metrics
          periodSeconds: 5
          timeoutSeconds: 2
          failureThreshold: 2
        resources:
          {{- toYaml $e.workerResources | nindent 10 }}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          runAsNonRoot: true
          capabilities:
            drop:
            - ALL
          seccompProfile:
            type: RuntimeDefault
        volumeMounts:
        - name: kafka-login
          mountPath: /etc/graylane/kafka-login
          readOnly: true
        - name: tmp
          mountPath: /tmp
        - name: kafka-ca
          mountPath: /etc/graylane/kafka-ca
          readOnly: true
      volumes:
      - name: kafka-login
        secret:
          secretName: {{ $root.Values.credentials.kafka.worker }}
          defaultMode: 292
          items:
          - key: username
            path: username
          - key: password
            path: password
          - key: mechanism
            path: mechanism
      - name: tmp
        emptyDir:
          sizeLimit: 256Mi
      - name: kafka-ca
        secret:
          secretName: {{ $root.Values.credentials.kafkaCa }}
          defaultMode: 292
      - name: engine-model
        persistentVolumeClaim:
          claimName: {{ $e.modelClaim }}
          readOnly: true
      - name: engine-tmp
        emptyDir:
          sizeLimit: {{ $e.tmpSizeLimit }}
      - name: engine-shm
        emptyDir:
          medium: Memory
          sizeLimit: {{ $e.shmSizeLimit }}
{{- end }}
