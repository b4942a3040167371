package kube

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
)

// What a kubelet does for a pod, done through the API (there is none).

// CreateNode registers a Node named name with address addr and reports
// it Ready, as a kubelet does when it joins; pods bound to it get addr as
// their hostIP. The API server's TaintNodesByCondition admission taints a
// new Node not-ready; the node lifecycle controller (not run here) lifts
// the taint once the kubelet reports Ready, and so does CreateNode.
func CreateNode(ctx context.Context, c kubernetes.Interface, name string, addr netip.Addr) error {
	n, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	n.Status = corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}, {Type: corev1.NodeHostName, Address: name}},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}},
	}
	if n, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return err
	}
	n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
	_, err = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	return err
}

// Bind assigns the pod to node through the binding subresource, as the
// scheduler does. A bound pod is deleted gracefully: it stays, with a
// deletionTimestamp, until its kubelet (here ForceDelete) removes it.
func Bind(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, node string) error {
	return c.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
}

// SetRunning reports the pod running with IP ip and its containers ready
// or not, through the status subresource, as a kubelet does after its
// probes: the EndpointSlice controller reads exactly these fields.
func SetRunning(ctx context.Context, c kubernetes.Interface, ns, name string, ip netip.Addr, ready bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
			s := corev1.ConditionFalse
			if ok {
				s = corev1.ConditionTrue
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == t && c.Status == s {
					return c // unchanged: keep its transition time
				}
			}
			return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: now}
		}
		st := &pod.Status
		st.Phase = corev1.PodRunning
		st.PodIP, st.PodIPs = ip.String(), []corev1.PodIP{{IP: ip.String()}}
		if st.StartTime == nil {
			st.StartTime = &now
		}
		st.Conditions = []corev1.PodCondition{
			cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true),
			cond(corev1.ContainersReady, ready), cond(corev1.PodReady, ready),
		}
		st.ContainerStatuses = st.ContainerStatuses[:0]
		for _, ctr := range pod.Spec.Containers {
			started := true
			st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{
				Name: ctr.Name, Image: ctr.Image, ImageID: ctr.Image, Ready: ready, Started: &started,
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: *st.StartTime}},
			})
		}
		_, err = c.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return err
	})
}

// ForceDelete removes a pod at once (grace period 0), as its kubelet does
// once the containers of a terminating pod have exited.
func ForceDelete(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	zero := int64(0)
	err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// fieldRefLabel matches metadata.labels['key'] and metadata.annotations['key'].
var fieldRefLabel = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)

// ContainerEnv resolves the environment of the named container of pod as
// a kubelet does: literal values (with $(VAR) references to earlier
// variables), the downward API (fieldRef), and keys of Secrets and
// ConfigMaps in the pod's namespace. It returns NAME=value strings, in
// order; an optional key that is missing is left out, a required one is
// an error (the kubelet would not start the container).
func ContainerEnv(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, container string) ([]string, error) {
	ctr, err := findContainer(pod, container)
	if err != nil {
		return nil, err
	}
	vals := map[string]string{}
	var out []string
	for _, e := range ctr.Env {
		v, ok, err := envValue(ctx, c, pod, e, vals)
		if err != nil {
			return nil, fmt.Errorf("pod %s container %s env %s: %w", pod.Name, container, e.Name, err)
		}
		if !ok {
			continue
		}
		vals[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	return out, nil
}

func findContainer(pod *corev1.Pod, name string) (*corev1.Container, error) {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], nil
		}
	}
	return nil, fmt.Errorf("pod %s has no container %q", pod.Name, name)
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

func envValue(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, e corev1.EnvVar, earlier map[string]string) (string, bool, error) {
	if e.ValueFrom == nil {
		return envRef.ReplaceAllStringFunc(e.Value, func(ref string) string {
			if v, ok := earlier[ref[2:len(ref)-1]]; ok {
				return v
			}
			return ref
		}), true, nil
	}
	switch vf := e.ValueFrom; {
	case vf.FieldRef != nil:
		v, err := podField(pod, vf.FieldRef.FieldPath)
		return v, err == nil, err
	case vf.SecretKeyRef != nil:
		s, err := c.CoreV1().Secrets(pod.Namespace).Get(ctx, vf.SecretKeyRef.Name, metav1.GetOptions{})
		optional := vf.SecretKeyRef.Optional != nil && *vf.SecretKeyRef.Optional
		if apierrors.IsNotFound(err) && optional {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		v, ok := s.Data[vf.SecretKeyRef.Key]
		if !ok && !optional {
			return "", false, fmt.Errorf("secret %s has no key %q", s.Name, vf.SecretKeyRef.Key)
		}
		return string(v), ok, nil
	case vf.ConfigMapKeyRef != nil:
		cm, err := c.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, vf.ConfigMapKeyRef.Name, metav1.GetOptions{})
		optional := vf.ConfigMapKeyRef.Optional != nil && *vf.ConfigMapKeyRef.Optional
		if apierrors.IsNotFound(err) && optional {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		v, ok := cm.Data[vf.ConfigMapKeyRef.Key]
		if !ok && !optional {
			return "", false, fmt.Errorf("configmap %s has no key %q", cm.Name, vf.ConfigMapKeyRef.Key)
		}
		return v, ok, nil
	}
	return "", false, fmt.Errorf("unsupported valueFrom %+v", e.ValueFrom)
}

// podField resolves a downward API field path of the pod.
func podField(pod *corev1.Pod, path string) (string, error) {
	if m := fieldRefLabel.FindStringSubmatch(path); m != nil {
		src := pod.Labels
		if m[1] == "annotations" {
			src = pod.Annotations
		}
		return src[m[2]], nil // a missing key is "" for the kubelet too
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	}
	return "", fmt.Errorf("unsupported fieldPath %q", path)
}

// MountConfigMaps writes the ConfigMap volumes the named container mounts
// under root, one directory per mount, and returns mountPath → directory,
// so that a test can run the container's command with the paths mapped.
func MountConfigMaps(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, container, root string) (map[string]string, error) {
	ctr, err := findContainer(pod, container)
	if err != nil {
		return nil, err
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	out := map[string]string{}
	for i, m := range ctr.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("pod %s mounts volume %q, which it does not declare", pod.Name, m.Name)
		}
		if v.ConfigMap == nil {
			continue
		}
		cm, err := c.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("pod %s volume %s: %w", pod.Name, m.Name, err)
		}
		dir := filepath.Join(root, fmt.Sprintf("mount-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for k, data := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(data), 0o644); err != nil {
				return nil, err
			}
		}
		out[m.MountPath] = dir
	}
	return out, nil
}

// MapPaths replaces, in each argument, a mount path prefix by the host
// directory MountConfigMaps wrote it to.
func MapPaths(args []string, mounts map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		for mp, dir := range mounts {
			if a == mp || strings.HasPrefix(a, strings.TrimSuffix(mp, "/")+"/") {
				out[i] = dir + strings.TrimPrefix(a, strings.TrimSuffix(mp, "/"))
			}
		}
	}
	return out
}

// ServiceAccountKubeconfig writes to path a kubeconfig whose credential
// is a token of ServiceAccount ns/sa, from the TokenRequest API as the
// kubelet projects it into a pod, so that a process runs with exactly
// the RBAC the ServiceAccount has.
func (cp *ControlPlane) ServiceAccountKubeconfig(ctx context.Context, ns, sa, path string) error {
	ttl := int64(time.Hour / time.Second)
	tr, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of serviceaccount %s/%s: %w", ns, sa, err)
	}
	return cp.WriteKubeconfig(path, "system:serviceaccount:"+ns+":"+sa, clientcmdapi.AuthInfo{Token: tr.Status.Token})
}
